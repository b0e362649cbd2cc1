"""The node's content cache (staging/cache.py) with a fetcher that writes files: entries
kept once, restaged read-only, evicted least recently used past the budget, and what a
crash leaves ignored."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest
from gpufleet_contracts.locations import S3Source, Source
from gpufleet_node_agent.staging.cache import ContentCache
from gpufleet_node_agent.staging.registry import Moved, Transfer
from gpufleet_node_agent.steps.base import WorkerFailed


class Store:
    """A source of files by URL, each at a version; counts the fetches."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.versions: dict[str, str] = {}
        self.fetched: list[str] = []
        self.during_fetch: dict[str, str] = {}  # url -> the version it changes to meanwhile

    def put(self, name: str, data: bytes, version: str) -> S3Source:
        url = f"s3://b/{name}"
        self.files[url], self.versions[url] = data, version
        return S3Source(url=url)

    async def fetch(self, source: Source, dest: Path, t: Transfer) -> None:
        assert isinstance(source, S3Source)
        self.fetched.append(source.url)
        await asyncio.sleep(0.01)
        (dest / "sub").mkdir()
        (dest / "sub" / "f.bin").write_bytes(self.files[source.url])
        if source.url in self.during_fetch:
            self.versions[source.url] = self.during_fetch.pop(source.url)

    async def version(self, source: Source, t: Transfer) -> str | None:
        assert isinstance(source, S3Source)
        if t.keys.get("aws", {}).get("access_key_id") != "right":
            raise WorkerFailed(f"{source.url} is forbidden")
        return self.versions[source.url]


def transfer(limit: int = 1 << 20, *, writable: bool = False) -> Transfer:
    heard: list[Moved] = []
    return Transfer({"aws": {"access_key_id": "right"}}, limit, heard.append, writable=writable)


def made(tmp_path: Path, name: str) -> Path:
    d = tmp_path / "workers" / name
    d.mkdir(parents=True)
    return d


async def test_a_second_worker_gets_read_only_links_and_no_fetch(tmp_path: Path) -> None:
    store, cache = Store(), ContentCache(tmp_path / "cache", 1000)
    fetch = cache.fetcher(store.fetch, store.version)
    src = store.put("a", b"abcd", "v1")
    one, two = made(tmp_path, "one"), made(tmp_path, "two")
    await fetch(src, one, transfer())
    await fetch(src, two, transfer())
    assert store.fetched == ["s3://b/a"]
    assert (cache.counts.hits, cache.counts.misses) == (1, 1)
    assert (cache.counts.fetched_bytes, cache.counts.served_bytes) == (4, 4)
    f1, f2 = one / "sub" / "f.bin", two / "sub" / "f.bin"
    assert f2.read_bytes() == b"abcd" and os.stat(f1).st_ino == os.stat(f2).st_ino
    assert os.stat(f2).st_mode & 0o777 == 0o444
    (key,) = cache.entries()
    entry = tmp_path / "cache" / key
    assert os.stat(entry / "data" / "sub").st_mode & 0o777 == 0o555
    assert json.loads((entry / "meta.json").read_text()) == {
        "url": "s3://b/a",
        "version": "v1",
        "size": 4,
    }
    if os.geteuid() != 0:  # root writes through any mode
        with pytest.raises(PermissionError):
            f2.open("ab")


async def test_a_writable_worker_gets_its_own_copy(tmp_path: Path) -> None:
    store, cache = Store(), ContentCache(tmp_path / "cache", 1000)
    fetch = cache.fetcher(store.fetch, store.version)
    src = store.put("a", b"abcd", "v1")
    await fetch(src, made(tmp_path, "one"), transfer())
    bare = made(tmp_path, "bare")
    await fetch(src, bare, transfer(writable=True))
    copied = bare / "sub" / "f.bin"
    copied.write_bytes(b"mine")  # its own file: the entry is untouched
    (key,) = cache.entries()
    assert (tmp_path / "cache" / key / "data" / "sub" / "f.bin").read_bytes() == b"abcd"
    assert cache.counts.hits == 1


async def test_a_new_version_is_fetched_again_and_a_refused_key_gets_nothing(
    tmp_path: Path,
) -> None:
    store, cache = Store(), ContentCache(tmp_path / "cache", 1000)
    fetch = cache.fetcher(store.fetch, store.version)
    src = store.put("a", b"abcd", "v1")
    await fetch(src, made(tmp_path, "one"), transfer())
    store.put("a", b"efgh", "v2")
    two = made(tmp_path, "two")
    await fetch(src, two, transfer())
    assert (two / "sub" / "f.bin").read_bytes() == b"efgh"
    assert store.fetched == ["s3://b/a", "s3://b/a"]
    wrong = Transfer({"aws": {"access_key_id": "wrong"}}, 1 << 20, lambda m: None)
    three = made(tmp_path, "three")
    with pytest.raises(WorkerFailed, match="forbidden"):
        await fetch(src, three, wrong)
    assert not any(three.iterdir()) and cache.counts.hits == 0


async def test_lru_entries_go_past_the_budget(tmp_path: Path) -> None:
    store, cache = Store(), ContentCache(tmp_path / "cache", 10)
    fetch = cache.fetcher(store.fetch, store.version)
    a, b, c = (store.put(n, b"1234", "v") for n in "abc")
    for i, src in enumerate((a, b, a, c)):  # a used again after b: b is the oldest
        await fetch(src, made(tmp_path, f"w{i}"), transfer())
    assert store.fetched == ["s3://b/a", "s3://b/b", "s3://b/c"]
    assert cache.counts.evicted == 1 and cache.held_bytes == 8
    assert [ContentCache.key(s, "v") for s in (a, c)] == cache.entries()
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == sorted(cache.entries())
    await fetch(b, made(tmp_path, "again"), transfer())
    assert store.fetched[-1] == "s3://b/b"
    # larger than the whole budget: the worker's alone, nothing kept
    big = store.put("big", b"x" * 11, "v")
    w = made(tmp_path, "big")
    await fetch(big, w, transfer())
    assert (w / "sub" / "f.bin").read_bytes() == b"x" * 11
    assert ContentCache.key(big, "v") not in cache.entries()


async def test_what_a_crash_left_is_removed_and_not_a_hit(tmp_path: Path) -> None:
    store = Store()
    src = store.put("a", b"abcd", "v1")
    root = tmp_path / "cache"
    key = ContentCache.key(src, "v1")
    half = root / f".tmp-{key}-dead"
    (half / "data").mkdir(parents=True)
    (half / "data" / "f.bin").write_bytes(b"ab")
    os.chmod(half / "data", 0o555)
    (root / key / "data").mkdir(parents=True)  # no meta.json: never renamed whole
    cache = ContentCache(root, 1000)
    w = made(tmp_path, "one")
    await cache.fetcher(store.fetch, store.version)(src, w, transfer())
    assert store.fetched == ["s3://b/a"] and cache.counts.misses == 1
    assert sorted(p.name for p in root.iterdir()) == [key]
    reopened = ContentCache(root, 1000)  # a restart keeps the whole entry
    await reopened.fetcher(store.fetch, store.version)(src, made(tmp_path, "two"), transfer())
    assert reopened.counts.hits == 1 and store.fetched == ["s3://b/a"]


async def test_two_workers_at_once_fetch_once(tmp_path: Path) -> None:
    store, cache = Store(), ContentCache(tmp_path / "cache", 1000)
    fetch = cache.fetcher(store.fetch, store.version)
    src = store.put("a", b"abcd", "v1")
    one, two = made(tmp_path, "one"), made(tmp_path, "two")
    await asyncio.gather(fetch(src, one, transfer()), fetch(src, two, transfer()))
    assert store.fetched == ["s3://b/a"]
    assert (one / "sub" / "f.bin").read_bytes() == (two / "sub" / "f.bin").read_bytes()


async def test_changed_while_fetched_too_large_or_failed_is_not_kept(tmp_path: Path) -> None:
    store, cache = Store(), ContentCache(tmp_path / "cache", 1000)
    fetch = cache.fetcher(store.fetch, store.version)
    src = store.put("a", b"abcd", "v1")
    store.during_fetch[src.url] = "v2"
    w = made(tmp_path, "one")
    await fetch(src, w, transfer())
    assert (w / "sub" / "f.bin").read_bytes() == b"abcd" and cache.entries() == []
    await fetch(src, made(tmp_path, "two"), transfer())  # kept now (v2 held still)
    with pytest.raises(WorkerFailed, match="too large"):
        await fetch(src, made(tmp_path, "small"), transfer(limit=3))

    async def broken(source: Source, dest: Path, t: Transfer) -> None:
        (dest / "half").write_bytes(b"x")
        raise WorkerFailed("cut off")

    other = store.put("b", b"x", "v1")
    with pytest.raises(WorkerFailed, match="cut off"):
        await cache.fetcher(broken, store.version)(other, made(tmp_path, "three"), transfer())
    assert len(cache.entries()) == 1
    assert [p.name for p in (tmp_path / "cache").iterdir()] == cache.entries()
