"""gpufleet's web console: an HTTP gateway acting for each signed-in person on their own
short-lived credential (README.md: how, and its threat model)."""
