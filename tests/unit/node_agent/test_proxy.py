"""The node's endpoint proxy (proxy/): the job read from the Host, the key's verdicts, the
headers a worker and a caller get, requests held while a worker starts, several workers in
turn, its meter and cold start phases; against real HTTP servers on unix sockets."""

from __future__ import annotations

import asyncio
import json
import os
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from gpufleet_contracts.serving import ColdStartPhase, key_digest
from gpufleet_node_agent.proxy import upstream
from gpufleet_node_agent.proxy.auth import Presented, presented
from gpufleet_node_agent.proxy.hosts import UrlTemplate
from gpufleet_node_agent.proxy.served import Endpoints
from gpufleet_node_agent.worker.workdir import LAUNCHED, Worker

from .proxykit import (
    TEMPLATE,
    Proxy,
    Scheduler,
    Upstream,
    endpoint_worker,
    new_key,
    running_proxy,
    short_dir,
    socket_of,
)

HOST = "j1.localhost:8480"


def client(proxy: Proxy, host: str = HOST) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=proxy.app, client=("203.0.113.7", 5555))
    return httpx.AsyncClient(transport=transport, base_url=f"http://{host}", timeout=30)


# --- the Host ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("host", "job"),
    [
        ("j1.localhost:8480", "j1"),
        ("J1.LocalHost:8480", "j1"),
        ("jab12cd.localhost:8480", "jab12cd"),
        ("j1.localhost", None),  # another port is another origin
        ("j1.localhost:8481", None),
        ("a.j1.localhost:8480", None),  # the job is one whole label
        ("..localhost:8480", None),
        (".localhost:8480", None),
        ("j1.localhost:8480.", None),
        ("j1%2e.localhost:8480", None),
        ("j1@127.0.0.1:4222", None),
        ("127.0.0.1:4222", None),
        ("localhost:8480", None),
        ("", None),
        (None, None),
    ],
)
def test_the_job_is_the_first_label_of_the_proxys_host(host: str | None, job: str | None) -> None:
    assert UrlTemplate.parse("http://{job}.localhost:8480").job_of(host) == job


def test_an_https_template_takes_its_default_port_either_way() -> None:
    t = UrlTemplate.parse("https://{job}.ep.example.com")
    assert t.job_of("j9.ep.example.com") == "j9"
    assert t.job_of("j9.ep.example.com:443") == "j9"
    assert t.job_of("j9.ep.example.com:80") is None
    assert t.url("j9") == "https://j9.ep.example.com"


@pytest.mark.parametrize(
    "template",
    [
        "http://localhost:8480",
        "ftp://{job}.x",
        "http://x{job}.y",
        "http://{job}.x/path",
        "http://u@{job}.x",
    ],
)
def test_a_template_that_is_not_one_origin_per_job_is_refused(template: str) -> None:
    with pytest.raises(ValueError):
        UrlTemplate.parse(template)


# --- the key and the headers --------------------------------------------------------------


def test_a_bearer_key_is_its_id_and_digest_never_the_key() -> None:
    key = new_key()
    secret = key.split("_", 2)[2]
    assert presented(f"Bearer {key}") == Presented(key[4:16], key_digest(secret))
    assert presented(f"bearer  {key} ") == Presented(key[4:16], key_digest(secret))
    assert presented(None) is None
    assert presented("Basic dXNlcjpwdw==") is None
    assert presented("Bearer gfk_short") is False
    assert presented(f"Bearer {key}x") is False


def test_the_worker_gets_no_credential_and_no_hop_by_hop_header() -> None:
    got = upstream.request_headers(
        [
            (b"Authorization", b"Bearer gfk_x"),
            (b"cookie", b"session=1"),
            (b"connection", b"keep-alive, x-secret-hop"),
            (b"x-secret-hop", b"1"),
            (b"te", b"trailers"),
            (b"x-forwarded-for", b"6.6.6.6"),
            (b"host", b"j1.localhost:8480"),
            (b"content-type", b"application/json"),
        ],
        client="203.0.113.7",
        proto="http",
        host="j1.localhost:8480",
    )
    assert got == [
        (b"content-type", b"application/json"),
        (b"host", b"j1.localhost:8480"),
        (b"x-forwarded-for", b"203.0.113.7"),
        (b"x-forwarded-proto", b"http"),
        (b"x-forwarded-host", b"j1.localhost:8480"),
    ]
    back = upstream.response_headers(
        [
            (b"Connection", b"close, x-h"),
            (b"x-h", b"1"),
            (b"Transfer-Encoding", b"chunked"),
            (b"x-ok", b"1"),
        ]
    )
    assert back == [(b"x-ok", b"1")]


# --- through the app, to real sockets -------------------------------------------------------


async def test_who_gets_what(tmp_path: Path) -> None:
    with short_dir() as root:
        w = endpoint_worker(root, "j1", "p1")
        up = await Upstream(socket_of(w)).start()
        sched = Scheduler()
        key, other = sched.key_for("j1"), sched.key_for("j2")
        try:
            async with running_proxy([w], sched) as proxy, client(proxy) as c:
                r = await c.get("/", headers={"host": "j2.localhost:8480"})  # not here
                assert (r.status_code, r.json()) == (404, {"detail": "not found"})
                r = await c.get("/", headers={"host": "127.0.0.1:4222"})
                assert (r.status_code, r.json()) == (404, {"detail": "not found"})
                r = await c.get("/x")
                assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
                r = await c.get("/x", headers={"authorization": "Bearer gfk_nonsense"})
                assert r.status_code == 401
                r = await c.get("/x", headers={"authorization": f"Bearer {new_key()}"})
                assert r.status_code == 401
                r = await c.get("/x", headers={"authorization": f"Bearer {other}"})
                assert (r.status_code, r.json()) == (404, {"detail": "not found"})
                assert up.seen == []  # nothing reached the worker yet
                r = await c.post(
                    "/predict?a=1&b=%2F",
                    content=b"x" * 1000,
                    headers={
                        "authorization": f"Bearer {key}",
                        "cookie": "s=1",
                        "x-forwarded-for": "6.6.6.6",
                        "x-mine": "kept",
                    },
                )
                assert r.status_code == 200
                assert r.headers["x-from-worker"] == "w" and "x-hop" not in r.headers
                got = r.json()
                assert got["target"] == "/predict?a=1&b=%2F" and got["body"] == 1000
                h = got["headers"]
                assert "authorization" not in h and "cookie" not in h
                assert h["x-mine"] == "kept" and h["host"] == HOST
                assert h["x-forwarded-for"] == "203.0.113.7"
                assert (h["x-forwarded-proto"], h["x-forwarded-host"]) == ("http", HOST)
                r = await c.get("/boom", headers={"authorization": f"Bearer {key}"})
                assert r.status_code == 500
                served = proxy.endpoints.of("j1")[0]
                m = served.meter
                assert (m.requests, m.errors, m.bytes_in) == (2, 1, 1000)
                assert m.bytes_out > 0
        finally:
            await up.stop()


async def test_verdicts_are_kept_for_the_time_the_scheduler_says() -> None:
    with short_dir() as root:
        w = endpoint_worker(root, "j1", "p1")
        up = await Upstream(socket_of(w)).start()
        sched = Scheduler(cache_s=5)
        key = sched.key_for("j1")
        try:
            async with running_proxy([w], sched) as proxy, client(proxy) as c:
                auth = {"authorization": f"Bearer {key}"}
                for _ in range(3):
                    assert (await c.get("/", headers=auth)).status_code == 200
                assert sched.asked == 1
                sched.cache_s = 0
                proxy.app.verdicts._cache.clear()
                for _ in range(2):
                    assert (await c.get("/", headers=auth)).status_code == 200
                assert sched.asked == 3
                sched.down = True  # nobody answers: retry later, never a connection error
                proxy.app.verdicts._cache.clear()
                r = await c.get("/", headers=auth)
                assert r.status_code == 503 and r.headers["retry-after"] == "5"
        finally:
            await up.stop()


async def test_a_request_to_a_starting_endpoint_is_held_until_it_answers() -> None:
    with short_dir() as root:
        w = endpoint_worker(root, "j1", "p1")
        sched = Scheduler()
        key = sched.key_for("j1")
        auth = {"authorization": f"Bearer {key}"}
        async with running_proxy([w], sched, hold_s=20) as proxy, client(proxy) as c:
            began = time.monotonic()
            held = asyncio.create_task(c.post("/add", json={"a": 1}, headers=auth))
            await asyncio.sleep(0.5)  # no socket yet: the container is starting
            assert not held.done()
            up = await Upstream(socket_of(w), ready=False).start()  # listening, not ready
            w.done_at[LAUNCHED] = datetime.now(UTC)  # as the pipeline records its launch
            await asyncio.sleep(0.5)
            assert not held.done() and up.seen == []
            up.ready = True
            try:
                r = await asyncio.wait_for(held, 10)
                assert r.status_code == 200 and r.json()["body"] == len(b'{"a":1}')
                assert 1.0 <= time.monotonic() - began < 3.0
                ready = proxy.endpoints.ready_event(proxy.endpoints.of("j1")[0])
                assert ready.url == "http://j1.localhost:8480"
                phases = [p.phase for p in ready.phases]
                assert phases == [ColdStartPhase.process_started, ColdStartPhase.first_answer]
                assert ready.phases[0].at < ready.phases[1].at
            finally:
                await up.stop()


async def test_past_the_hold_a_starting_endpoint_answers_503_with_retry_after() -> None:
    with short_dir() as root:
        w = endpoint_worker(root, "j1", "p1")
        sched = Scheduler()
        key = sched.key_for("j1")
        async with running_proxy([w], sched, hold_s=0.5) as proxy, client(proxy) as c:
            began = time.monotonic()
            r = await c.get("/", headers={"authorization": f"Bearer {key}"})
            assert r.status_code == 503 and r.headers["retry-after"] == "5"
            assert 0.5 <= time.monotonic() - began < 2.0
            assert proxy.endpoints.of("j1")[0].meter.errors == 1


async def test_a_worker_that_ended_closes_its_url() -> None:
    with short_dir() as root:
        w = endpoint_worker(root, "j1", "p1")
        up = await Upstream(socket_of(w)).start()
        sched = Scheduler()
        auth = {"authorization": f"Bearer {sched.key_for('j1')}"}
        try:
            async with running_proxy([w], sched) as proxy, client(proxy) as c:
                assert (await c.get("/", headers=auth)).status_code == 200
                w.file("exit.json").write_text("{}")
                r = await c.get("/", headers=auth)
                assert (r.status_code, r.json()) == (404, {"detail": "not found"})
                proxy.workers.clear()
                assert (await c.get("/", headers=auth)).status_code == 404
        finally:
            await up.stop()


async def test_several_workers_of_a_job_answer_in_turn() -> None:
    with short_dir() as root:
        ws = [endpoint_worker(root, "j1", f"p{i}", worker=i) for i in range(2)]
        ups = [await Upstream(socket_of(w), name=f"w{i}").start() for i, w in enumerate(ws)]
        sched = Scheduler()
        auth = {"authorization": f"Bearer {sched.key_for('j1')}"}
        try:
            async with running_proxy(ws, sched) as proxy, client(proxy) as c:
                await asyncio.sleep(0.3)  # both probed ready
                names = [(await c.get("/", headers=auth)).json()["name"] for _ in range(4)]
                assert sorted(names) == ["w0", "w0", "w1", "w1"]
                assert names[0] != names[1] and names[1] != names[2]
        finally:
            for up in ups:
                await up.stop()


async def test_a_body_over_the_limit_is_413() -> None:
    with short_dir() as root:
        w = endpoint_worker(root, "j1", "p1")
        up = await Upstream(socket_of(w)).start()
        sched = Scheduler()
        auth = {"authorization": f"Bearer {sched.key_for('j1')}"}
        try:
            async with running_proxy([w], sched, max_body=1000) as proxy, client(proxy) as c:
                r = await c.post("/", content=b"x" * 1001, headers=auth)
                assert r.status_code == 413

                async def chunks():  # no Content-Length: counted as it streams
                    for _ in range(5):
                        yield b"y" * 300

                r = await c.post("/", content=chunks(), headers=auth)
                assert r.status_code == 413
                assert (await c.post("/", content=b"x" * 1000, headers=auth)).status_code == 200
                # the one cut off on its way was never a whole request to the worker
                assert [len(s.body) for s in up.seen if s.complete] == [1000]
        finally:
            await up.stop()


async def test_a_link_or_another_users_socket_in_place_of_the_workers_is_not_followed() -> None:
    with short_dir() as root:
        w = endpoint_worker(root, "j1", "p1")
        elsewhere = await Upstream(root / "node-service.sock", name="node").start()
        sched = Scheduler()
        auth = {"authorization": f"Bearer {sched.key_for('j1')}"}
        try:
            os.symlink(root / "node-service.sock", socket_of(w))
            async with (
                running_proxy([w], sched, hold_s=0.5, uid=os.getuid()) as proxy,
                client(proxy) as c,
            ):
                assert (await c.get("/", headers=auth)).status_code == 503
            socket_of(w).unlink()
            os.chown(root / "node-service.sock", 4242, 4242)
            os.link(root / "node-service.sock", socket_of(w))  # a socket of another user
            async with (
                running_proxy([w], sched, hold_s=0.5, uid=10000) as proxy,
                client(proxy) as c,
            ):
                assert (await c.get("/", headers=auth)).status_code == 503
            assert elsewhere.seen == []
        finally:
            await elsewhere.stop()


class Published:
    """The bus as the proxy publishes to it (gpufleet_bus.publish's Publisher)."""

    def __init__(self) -> None:
        self.messages: list[tuple[str, dict[str, object]]] = []

    async def publish(self, message: bytes, subject: str, **kw: object) -> None:
        self.messages.append((subject, json.loads(message)))

    def of(self, verb: str) -> list[dict[str, object]]:
        return [m for s, m in self.messages if f".{verb}." in s]


async def test_ready_and_metered_are_told_and_an_agent_restart_goes_on_from_them() -> None:
    with short_dir() as root:
        w = endpoint_worker(root, "j1", "p1")
        w.done_at[LAUNCHED] = datetime.now(UTC)
        up = await Upstream(socket_of(w)).start()
        sched, bus = Scheduler(), Published()
        auth = {"authorization": f"Bearer {sched.key_for('j1')}"}
        try:
            endpoints = Endpoints(
                lambda: [w],
                minion_id="n1",
                publisher=bus,
                template=TEMPLATE,
                uid=None,
                metered_every_s=0.2,
            )
            async with (
                running_proxy([w], sched, endpoints=endpoints) as proxy,
                client(proxy) as c,
            ):
                for _ in range(3):
                    assert (await c.post("/", content=b"abc", headers=auth)).status_code == 200
                await asyncio.sleep(0.8)
            [ready] = bus.of("endpoint_ready")
            assert ready["url"] == "http://j1.localhost:8480"
            phases = [p["phase"] for p in ready["phases"]]  # type: ignore[attr-defined]
            assert phases == ["process_started", "first_answer"]
            assert bus.of("endpoint_metered")[-1]["requests"] == 3
            # an agent restarted: the same worker, a new proxy
            again, bus2 = Worker(w.spec, w.dir), Published()
            endpoints = Endpoints(
                lambda: [again], minion_id="n1", publisher=bus2, template=TEMPLATE, uid=None
            )
            async with (
                running_proxy([again], sched, endpoints=endpoints) as proxy,
                client(proxy) as c,
            ):
                assert (await c.post("/", content=b"abc", headers=auth)).status_code == 200
                await asyncio.sleep(0.8)
                again.file("exit.json").write_text("{}")  # it ends: told once more
                await asyncio.sleep(0.8)
            assert bus2.of("endpoint_ready") == []  # told already, with all its phases
            totals = bus2.of("endpoint_metered")
            assert totals[-1]["requests"] == 4 and totals[-1]["bytes_in"] == 12
        finally:
            await up.stop()
