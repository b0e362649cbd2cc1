"""gpufleet node agent: registers a GPU node, heartbeats, runs the workers placed on it."""
