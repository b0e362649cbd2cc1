"""`python -m gpufleet_gcp_emulator --compute-port P --pubsub-port Q`: the emulated cloud.

Prints one JSON line when ready: {"compute": "http://127.0.0.1:P", "grpc": "127.0.0.1:Q"}.
With --nats-url (or GPUFLEET_NATS_URL), a RUNNING instance boots a simulated node agent.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
from pathlib import Path

from .agents import AgentLauncher
from .compute import serve_compute
from .grpc_api import serve_grpc
from .state import Cloud


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m gpufleet_gcp_emulator")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--compute-port", type=int, default=0)
    p.add_argument("--pubsub-port", type=int, default=0, help="gRPC: Pub/Sub and Logging")
    p.add_argument("--delay-s", type=float, default=0.5, help="each instance state transition")
    p.add_argument("--nats-url", default=os.environ.get("GPUFLEET_NATS_URL"))
    p.add_argument("--agent-dir", default=".run/gcp-agents")
    p.add_argument("--agent-heartbeat-s", type=float, default=1.0)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")

    launcher = (
        AgentLauncher(args.nats_url, Path(args.agent_dir).absolute(), args.agent_heartbeat_s)
        if args.nats_url
        else None
    )
    cloud = Cloud(delay_s=args.delay_s, agent_hook=launcher)
    http = serve_compute(cloud, args.host, args.compute_port)
    grpc_server, grpc_port = serve_grpc(cloud, args.host, args.pubsub_port)
    ready = {
        "compute": f"http://{args.host}:{http.server_address[1]}",
        "grpc": f"{args.host}:{grpc_port}",
    }
    print(json.dumps(ready), flush=True)

    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    done.wait()
    if launcher is not None:
        launcher.stop_all()
    grpc_server.stop(grace=1)
    http.shutdown()
    sys.exit(0)


if __name__ == "__main__":
    main()
