"""Staging benchmark (issue 27): the node's fetchers against the raw clients, on moto's S3
and the GCS emulator of gpufleet_devstack.storage, in the same run.

    uv run python benchmarks/staging/bench_staging.py --size-mb 1024 --files 10000
    uv run python benchmarks/staging/bench_staging.py --size-mb 100 --files 1000   # quick

Each figure (benchmarks/staging/README.md):
- `big`: one object of `--size-mb` MiB (random bytes): the raw client (boto3
  `download_file`, google-cloud-storage `download_to_filename`) vs the node's fetcher
  (staging/s3.py, gcs.py) into a fresh directory; MB/s and their ratio.
- `small`: `--files` objects of `--file-kb` KiB under a prefix: the raw client listing then
  downloading each, one after the other, vs the node's fetcher of the prefix.
- `cache`: the node's content cache (staging/cache.py) in front of the S3 fetcher: a miss,
  then a hit (the version asked: a HEAD, or a HEAD per object of a prefix) and the restage
  alone (hard links of the entry into a worker's directory).
- `outzip`: the output step's archive (steps/outzip.py) of the big file, then its upload by
  the S3 uploader (verified: HEAD and the multipart ETag computed).
CPU: this process's user+system time (getrusage: the fetchers' threads included, the
emulators' processes not) per GB moved.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import resource
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import boto3
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage
from gpufleet_contracts.locations import GcsSource, S3Source
from gpufleet_devstack.storage import running_gcs, running_s3
from gpufleet_node_agent.staging.cache import DATA, ContentCache, restage
from gpufleet_node_agent.staging.gcs import Gcs
from gpufleet_node_agent.staging.guard import AddressGuard
from gpufleet_node_agent.staging.registry import Transfer
from gpufleet_node_agent.staging.s3 import S3
from gpufleet_node_agent.steps.outzip import archive

LOCAL = AddressGuard.of(["127.0.0.0/8"])
MIB = 1024 * 1024
GB = 1000**3


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def timed(f: Callable[[], Any]) -> dict[str, float]:
    c, t = cpu(), time.perf_counter()
    f()
    return {"s": time.perf_counter() - t, "cpu_s": cpu() - c}


def rates(raw: dict[str, float], node: dict[str, float], nbytes: int) -> dict[str, Any]:
    return {
        "bytes": nbytes,
        "raw_MBps": round(nbytes / MIB / raw["s"], 1),
        "node_MBps": round(nbytes / MIB / node["s"], 1),
        "node_vs_raw": round(raw["s"] / node["s"], 2),
        "raw_s": round(raw["s"], 2),
        "node_s": round(node["s"], 2),
        "raw_cpu_s_per_GB": round(raw["cpu_s"] / (nbytes / GB), 2),
        "node_cpu_s_per_GB": round(node["cpu_s"] / (nbytes / GB), 2),
    }


def fresh(root: Path, name: str) -> Path:
    d = root / name
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    return d


def transfer(keys: dict[str, Any] | None = None) -> Transfer:
    return Transfer(keys or {}, 1 << 50, lambda moved: None)


def big_file(path: Path, size_mb: int) -> None:
    with path.open("wb") as f:
        block = os.urandom(MIB)
        for i in range(size_mb):
            f.write(block[:-8] + i.to_bytes(8, "big"))  # not compressible, not repeated


def bench_s3(work: Path, big: Path, files: int, file_kb: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with running_s3(work / "s3") as server:
        e = server.endpoint
        client = boto3.client("s3", **e.boto3_kwargs())
        client.create_bucket(Bucket="bench")
        client.upload_file(str(big), "bench", "big.bin")
        body = os.urandom(file_kb * 1024)
        for i in range(files):
            client.put_object(Bucket="bench", Key=f"small/{i:05d}.bin", Body=body)
        keys = {
            "wasabi": {"access_key_id": e.access_key_id, "secret_access_key": e.secret_access_key}
        }
        s3 = S3(LOCAL)
        size = big.stat().st_size
        raw = timed(lambda: client.download_file("bench", "big.bin", str(fresh(work, "raw") / "b")))
        obj = S3Source(url="s3://bench/big.bin", endpoint=e.url)
        node = timed(lambda: asyncio.run(s3.fetch(obj, fresh(work, "node"), transfer(keys))))
        out["big"] = rates(raw, node, size)

        def raw_small() -> None:
            d = fresh(work, "raw")
            pages = client.get_paginator("list_objects_v2").paginate(
                Bucket="bench", Prefix="small/"
            )
            for o in (o for p in pages for o in p.get("Contents", [])):
                client.download_file("bench", o["Key"], str(d / o["Key"].split("/")[-1]))

        prefix = S3Source(url="s3://bench/small/", endpoint=e.url)
        raw = timed(raw_small)
        node = timed(lambda: asyncio.run(s3.fetch(prefix, fresh(work, "node"), transfer(keys))))
        out["small"] = rates(raw, node, files * len(body)) | {"files": files}
        out["cache"] = {
            "big": cache_figures(work, s3, obj, keys),
            "small": cache_figures(work, s3, prefix, keys),
        }
        out["outzip_upload"] = outzip_upload(work, big, s3, e.url, keys)
    return out


def cache_figures(work: Path, s3: S3, source: S3Source, keys: dict[str, Any]) -> dict[str, Any]:
    cache = ContentCache(fresh(work, "cache-" + source.url.rsplit("/", 2)[-2]), 1 << 40)
    fetch = cache.fetcher(s3.fetch, s3.version)
    miss = timed(lambda: asyncio.run(fetch(source, fresh(work, "w0"), transfer(keys))))
    hit = timed(lambda: asyncio.run(fetch(source, fresh(work, "w1"), transfer(keys))))
    (key,) = cache.entries()
    runs = []
    for i in range(5):
        d = fresh(work, f"w{2 + i}")
        runs.append(timed(lambda d=d: restage(cache.root / key / DATA, d, link=True))["s"])
    copy = timed(lambda: restage(cache.root / key / DATA, fresh(work, "wc"), link=False))
    return {
        "miss_s": round(miss["s"], 2),
        "hit_s": round(hit["s"], 3),  # the version asked + the restage
        "restage_link_ms_best_of_5": round(min(runs) * 1000, 1),
        "restage_link_ms_median_of_5": round(sorted(runs)[2] * 1000, 1),
        "restage_copy_s": round(copy["s"], 2),
        "hits": cache.counts.hits,
        "misses": cache.counts.misses,
    }


def outzip_upload(work: Path, big: Path, s3: S3, url: str, keys: dict[str, Any]) -> dict[str, Any]:
    src = fresh(work, "output")
    os.link(big, src / "model.bin")
    zipped = fresh(work, "zip") / "job.zip"
    z = timed(lambda: archive(src, zipped, 1 << 50))
    target = S3Source(url="s3://bench/outputs/", endpoint=url)
    up = timed(lambda: asyncio.run(s3.put(zipped, target, transfer(keys))))
    size = zipped.stat().st_size
    return {
        "bytes": size,
        "zip_s": round(z["s"], 2),
        "zip_MBps": round(size / MIB / z["s"], 1),
        "zip_cpu_s_per_GB": round(z["cpu_s"] / (size / GB), 2),
        "upload_s": round(up["s"], 2),
        "upload_MBps": round(size / MIB / up["s"], 1),
        "upload_cpu_s_per_GB": round(up["cpu_s"] / (size / GB), 2),
    }


def bench_gcs(work: Path, big: Path, files: int, file_kb: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with running_gcs(work / "gcs") as server:
        e = server.endpoint
        client = storage.Client(
            project=e.project,
            credentials=AnonymousCredentials(),  # type: ignore[no-untyped-call]
            client_options={"api_endpoint": e.url},
        )
        bucket = client.create_bucket("bench")
        bucket.blob("big.bin").upload_from_filename(str(big))
        body = os.urandom(file_kb * 1024)
        for i in range(files):
            bucket.blob(f"small/{i:05d}.bin").upload_from_string(body)
        gcs = Gcs(LOCAL, e.url)
        size = big.stat().st_size
        raw = timed(
            lambda: bucket.blob("big.bin").download_to_filename(str(fresh(work, "raw") / "b"))
        )
        obj = GcsSource(url="gs://bench/big.bin")
        node = timed(lambda: asyncio.run(gcs.fetch(obj, fresh(work, "node"), transfer())))
        out["big"] = rates(raw, node, size)

        def raw_small() -> None:
            d = fresh(work, "raw")
            for b in client.list_blobs("bench", prefix="small/"):
                b.download_to_filename(str(d / b.name.split("/")[-1]))

        prefix = GcsSource(url="gs://bench/small/")
        raw = timed(raw_small)
        node = timed(lambda: asyncio.run(gcs.fetch(prefix, fresh(work, "node"), transfer())))
        out["small"] = rates(raw, node, files * len(body)) | {"files": files}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=1024)
    parser.add_argument("--files", type=int, default=10000)
    parser.add_argument("--file-kb", type=int, default=4)
    parser.add_argument("--stores", default="s3,gcs")
    parser.add_argument("--work", type=Path, default=None, help="scratch (default: a tmp dir)")
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "bench_staging.json"
    )
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-staging-", dir=args.work))
    try:
        big = work / "big.bin"
        big_file(big, args.size_mb)
        result: dict[str, Any] = {
            "args": {k: str(v) for k, v in vars(args).items()},
            "machine": {
                "cpus": os.cpu_count(),
                "load": os.getloadavg(),
                "python": platform.python_version(),
            },
        }
        if "s3" in args.stores:
            result["s3"] = bench_s3(work, big, args.files, args.file_kb)
            print(json.dumps(result["s3"], indent=1), flush=True)
        if "gcs" in args.stores:
            result["gcs"] = bench_gcs(work, big, args.files, args.file_kb)
            print(json.dumps(result["gcs"], indent=1), flush=True)
        result["machine"]["load_after"] = os.getloadavg()
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
