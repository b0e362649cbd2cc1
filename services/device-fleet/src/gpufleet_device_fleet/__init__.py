"""gpufleet package."""
