"""Development only: the node agent's GPU runtime checked on a real NVIDIA GPU (README.md)."""
