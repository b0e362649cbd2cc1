"""A local Google Cloud emulator for gpufleet tests and `just up --gcp`."""
