"""The node itself: its hardware (inventory, GPUs, CUDA), its GPUs' check, MPS daemons and
loop devices."""
