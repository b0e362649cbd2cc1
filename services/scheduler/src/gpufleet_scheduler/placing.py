"""What placing one worker writes: the worker's placement fields, its events, its claims.

Pure apart from queueing the events in the transaction's outbox (`emit`); the queue pass
(commit.py) calls it for each worker a pass placed.
"""

from __future__ import annotations

import uuid
from datetime import datetime

from gpufleet_bus import emit, tracing
from gpufleet_contracts.jobs import JobSpec, StartWorker, WorkerPlaced, WorkerState
from gpufleet_store import Doc, Transaction

from . import jobdoc, mounts, sealing, serving
from .keyuse import WorkerSecrets
from .placement import Placement


def place_worker(
    tx: Transaction,
    job: Doc,
    spec: JobSpec,
    w: Doc,
    d: Placement,
    slots: list[tuple[str, int, int]],
    now: datetime,
    epoch: int,
    secrets: WorkerSecrets,
) -> list[Doc]:
    """Place worker `w` of `job` as `d` decided: its fields, its WorkerPlaced (the rate is
    locked here, R-SCHED-2) and its StartWorker with the mount plan (R-JOB-3/4) and the job's
    env values and attached keys, `secrets` (keyuse.resolve: the one message that carries
    them), sealed to that node's key (sealing.py) in `tx`; returns the claim documents of the
    GPU slots it takes."""
    node = d.node
    placement_id = uuid.uuid4().hex
    fraction = d.fraction
    # A CPU-only worker (R-JOB-2) holds CPUs, no GPU: its rate is per CPU-hour.
    gpu_model = None if d.cpus else node.gpu_model
    served = serving.serving_for(spec)
    # the job's trace (gpufleet_bus.tracing): its placement a step of it when it is sampled
    trace = tracing.mark(
        job.get("trace"),
        "place worker",
        {
            "gpufleet.job.id": job["_id"],
            "gpufleet.worker": w["index"],
            "gpufleet.node": node.node_id,
        },
    )
    w.update(
        state=WorkerState.placed.value,
        placement_id=placement_id,
        node_id=node.node_id,
        minion_id=node.minion_id,
        region=node.region,
        gpu_model=gpu_model,
        gpu_indices=list(d.gpu_indices),
        claims=[[g, s] for _, g, s in slots],
        gpu_fraction=None if fraction is None else str(fraction),
        cpu_count=d.cpus or None,
        rate=str(d.rate),
        rate_per_gpu_hour=None if d.cpus else str(d.rate_per_gpu_hour),
        charge=d.charge,
        placed_at=now,
        epoch=epoch,
        # an endpoint's or notebook's URL on that node's proxy (None: neither, or a node
        # without one)
        url=serving.url_of(node.proxy_url, job["_id"]) if served is not None else None,
        # every node this worker was placed on: its log is read from those nodes' subjects
        ran_on=[*[m for m in w.get("ran_on") or () if m != node.minion_id], node.minion_id],
    )
    emit(
        tx,
        WorkerPlaced(
            job_id=job["_id"],
            worker=w["index"],
            placement_id=placement_id,
            node_id=node.node_id,
            minion_id=node.minion_id,
            region=node.region,
            gpu_model=gpu_model or "",
            gpu_indices=list(d.gpu_indices),
            gpu_count=len(d.gpu_indices),
            cpu_count=d.cpus,
            rate=d.rate,
            charge=d.charge,
            payer=job["owner"],
            node_owner=node.owner,
            placed_at=now,
            creator=job["creator"],
            job_type=spec.type,
            gpu_fraction=fraction,
            rate_per_gpu_hour=None if d.cpus else d.rate_per_gpu_hour,
        ),
        trace=trace,
    )
    mp = mounts.plan(spec, w["index"])
    memory = jobdoc.share_memory(node.gpu_model, node.gpu_memory_mb, fraction)
    # R-JOB-7: a registry key's values are for the pull alone, the other keys for the worker;
    # all of them sealed to the node, the clear fields left empty.
    sealed = sealing.seal(secrets, node.sealing_key)
    emit(
        tx,
        StartWorker(
            minion_id=node.minion_id,
            job_id=job["_id"],
            job_name=job["name"],
            worker=w["index"],
            command=spec.command_for(w["index"]),
            gpu_indices=list(d.gpu_indices),
            placement_id=placement_id,
            mounts=list(mp.mounts),
            output_archive=mp.output_archive,
            output=mp.output,
            gpu_fraction=fraction,
            gpu_memory_limit_mb=memory,
            cpu_count=d.cpus or None,
            disk_size_gb=spec.disk_size_gb,
            image=spec.environment.image,
            sealed_secrets=sealed,
            base_environment=spec.environment.base(),
            packages=spec.environment.packages,
            owner=job["owner"],
            creator=job["creator"],
            serving=served,
            reservation=spec.reservation,  # R-RES-3: its node publishes it with mDNS
        ),
        # its box opens only on the node; its outbox row is sealed with the scheduler's key
        # besides, as every secret it stores, until the relay sends it
        sealed=secrets.any,
        trace=trace,
    )
    return [
        {
            "_id": cid,
            "node_id": node.node_id,
            "gpu_index": g,
            "share": s,
            "job_id": job["_id"],
            "worker": w["index"],
            "placement_id": placement_id,
            "epoch": epoch,
        }
        for cid, g, s in slots
    ]
