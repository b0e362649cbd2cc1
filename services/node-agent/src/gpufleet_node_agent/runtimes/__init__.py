"""How a worker runs: the runtime port (port.py) and its two adapters, bare processes
(process.py) and containers (podman.py, with runc/crun: runc.py)."""
