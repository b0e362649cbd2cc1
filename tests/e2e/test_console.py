"""The web console in a real browser: Debian's chromium driven by Playwright (its own browser
download is never used). A person signs in with the link `gpufleet console login` prints and
sees their account's objects only, live, and an alert fired by a rule they added; an operator
sees every account. The system's node agent is scraped by a real Prometheus (Debian's
`prometheus`) that the provisioner evaluates alert rules against. Screenshots of each page are
kept under the pytest base temp (`console-screenshots/`)."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from gpufleet_contracts.alerts import AlertState, ListAlerts, RemoveAlertRule
from gpufleet_contracts.billing import LedgerSeriesQuery
from gpufleet_devstack import identities, wait_for
from gpufleet_devstack.processes import free_port
from gpufleet_devstack.prometheus import PrometheusServer, find_prometheus, running_prometheus
from gpufleet_devstack.up import NODE_NAME

from .conftest import BARE_OWN_JOBS, System, _running_system

playwright = pytest.importorskip("playwright.sync_api")

CHROMIUM = Path("/usr/bin/chromium")
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
OTHER = "console-other"  # a second account, with a job and a node of its own
OTHER_NODE = "other-node"
GONE = "console-gone"  # an account an operator adds and removes in the console
WAITING = ["--gpu-count", "0", "--cpu-count", "12", "--max-price", "0.05"]  # stays queued
WAIT_REASON = "offers 8 CPUs to CPU-only jobs, job needs 12"
PRINT_AND_RUN = "import time; print('hello from the console test', flush=True); time.sleep(2)"

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason="no chromium (just setup)")


def answers(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=2)
    except urllib.error.HTTPError:
        return True  # 401: up, and nobody signed in
    except OSError:
        return False
    return True


@dataclass(frozen=True)
class Console:
    url: str
    system: System
    shots: Path

    def login_link(self, env: dict[str, str]) -> str:
        """What a person runs: `gpufleet console login` with their own CLI identity."""
        env = {**env, "GPUFLEET_CONSOLE_URL": self.url}
        link: str = json.loads(self.system.cli("console", "login", "--json", env=env).stdout)["url"]
        assert link.startswith(f"{self.url}/login?code=")
        return link


@dataclass(frozen=True)
class Scraper:
    """A real Prometheus scraping the node agent's /metrics, which listens on `agent_port`."""

    prometheus: PrometheusServer
    agent_port: int


@pytest.fixture(scope="module")
def scraper(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scraper | None]:
    """Started before the system, so the provisioner is told its URL; None without prometheus."""
    if find_prometheus() is None:
        yield None
        return
    port = free_port()
    with running_prometheus([f"127.0.0.1:{port}"], tmp_path_factory.mktemp("metrics"), 1.0) as p:
        yield Scraper(p, port)


@pytest.fixture(scope="module")
def system(tmp_path_factory: pytest.TempPathFactory, scraper: Scraper | None) -> Iterator[System]:
    """The shared system; its provisioner evaluates alert rules every second against
    `scraper`'s Prometheus, which scrapes the node agent's simulated GPU."""
    if scraper is None:
        yield from _running_system(tmp_path_factory)
        return
    agent = {**BARE_OWN_JOBS, "GPUFLEET_METRICS_PORT": str(scraper.agent_port)}
    alerts = {"GPUFLEET_PROMETHEUS_URL": scraper.prometheus.url, "GPUFLEET_ALERT_EVAL_S": "1"}
    yield from _running_system(tmp_path_factory, agent, alerts)


@pytest.fixture(scope="module")
def other(system: System) -> dict[str, Any]:
    """Account `console-other`: a user's CLI environment, a waiting job and a node; and a
    job of `local` run to its end (billed). Made before the browser starts: Playwright's
    event loop then runs in this thread, where the system's helpers start their own."""
    asyncio.run(identities.ensure_account(system.nats, OTHER, "team"))
    env = {**system.env, "GPUFLEET_NATS_CREDS": str(identities.user_creds(system.nats, OTHER))}
    system.cli("provider", "enable", "physical", env=env)
    system.cli("region", "create", "other-region", "--provider", "physical", env=env)
    system.cli(
        "node", "add", "--region", "other-region", "--name", OTHER_NODE,
        "--minion-id", "other-minion", env=env,
    )  # fmt: skip
    job = system.cli("job", "submit", "--name", "theirs", *WAITING, "--json", "--", "true", env=env)
    billed = system.submit("--", "python", "-c", PRINT_AND_RUN, name="billed", gpus=1)
    system.wait_state(billed, "finished")
    series = LedgerSeriesQuery()
    wait_for(
        lambda: (system.ask(series.SUBJECT, series.to_bytes()) or {}).get("points"),
        timeout=60,
        message="the billed job is not in the ledger",
    )
    return {"env": env, "job": json.loads(job.stdout)["id"], "billed": billed}


@pytest.fixture(scope="module")
def console(
    system: System, other: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
) -> Console:
    port = free_port()
    system.add("gateway", "gateway", {"GPUFLEET_CONSOLE_PORT": str(port)})
    url = f"http://127.0.0.1:{port}"
    wait_for(lambda: answers(f"{url}/api/me"), timeout=60, message="the console did not start")
    return Console(url, system, tmp_path_factory.mktemp("console-screenshots"))


@pytest.fixture(scope="module")
def browser(console: Console) -> Iterator[Any]:
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            yield browser
        finally:
            browser.close()


def signed_in(browser: Any, link: str) -> Any:
    page = browser.new_context(viewport={"width": 1200, "height": 760}).new_page()
    page.goto(link)
    page.wait_for_selector("#logout")
    return page


def api(page: Any, path: str, status: int = 200) -> Any:
    """The JSON API as the page's browser asks it (its session cookie)."""
    origin = "/".join(page.url.split("/")[:3])
    response = page.request.get(origin + path)
    assert response.status == status, (path, response.status, response.text())
    return response.json()


def test_a_job_submitted_through_the_cli_appears_in_the_queue_within_2_s(
    console: Console, browser: Any, system: System, other: dict[str, Any]
) -> None:
    page = signed_in(browser, console.login_link(system.cli_env))
    page.goto(f"{console.url}/queue")
    page.wait_for_selector("#queue")
    job_id = system.json("job", "submit", "--name", "waits", *WAITING, "--", "true")["id"]
    submitted = time.monotonic()
    row = page.wait_for_selector(f'#queue tr[data-job="{job_id}"]', timeout=2000)
    seen_s = time.monotonic() - submitted
    assert WAIT_REASON in row.inner_text(), row.inner_text()
    waited = row.query_selector("[data-since]")  # counted by the browser from queued_at
    assert waited is not None and waited.inner_text() in {"0s", "1s", "2s"}, row.inner_text()
    page.screenshot(path=str(console.shots / "queue.png"))
    print(f"queued job shown {seen_s:.2f} s after `job submit` returned")
    system.cli("job", "cancel", job_id)


def test_an_account_sees_none_of_another_accounts_jobs_nodes_or_costs(
    console: Console, browser: Any, system: System, other: dict[str, Any]
) -> None:
    finished = other["billed"]
    page = signed_in(browser, console.login_link(system.cli_env))
    page.wait_for_selector(f'[data-node="{NODE_NAME}"]')
    assert OTHER_NODE not in page.content() and other["job"] not in page.content()
    # the JSON API directly: the user's own connection, whatever the request names
    queue = api(page, "/api/queue")
    listed = [j["id"] for part in ("queued", "running", "recent") for j in queue[part]]
    assert finished in listed and other["job"] not in listed
    assert {j["owner"] for part in ("queued", "running", "recent") for j in queue[part]} == {
        identities.LOCAL_ACCOUNT
    }
    nodes = [n for r in api(page, "/api/fleet")["regions"] for n in r["nodes"]]
    assert {n["owner"] for n in nodes} == {identities.LOCAL_ACCOUNT}
    assert [s["account"] for s in api(page, "/api/costs")] == [identities.LOCAL_ACCOUNT]
    api(page, f"/api/jobs/{other['job']}", 404)
    api(page, f"/api/jobs/{other['job']}?account={OTHER}", 404)
    cancel = page.request.post(f"{console.url}/api/jobs/{other['job']}/cancel?account={OTHER}")
    assert cancel.status == 404, cancel.text()
    api(page, "/api/accounts", 403)
    removal = page.request.delete(f"{console.url}/api/accounts/{OTHER}")
    assert removal.status == 403, removal.text()
    page.goto(f"{console.url}/costs")
    page.wait_for_selector(".chart canvas")
    page.screenshot(path=str(console.shots / "costs.png"))
    page.goto(f"{console.url}/jobs/{finished}")
    page.wait_for_selector("#log")
    assert "hello from the console test" in page.inner_text("#log")
    assert "finished" in page.inner_text("h1")
    page.screenshot(path=str(console.shots / "job.png"))


def test_a_fired_alert_appears_on_the_alerts_page(
    console: Console, browser: Any, system: System, scraper: Scraper | None
) -> None:
    if scraper is None:
        pytest.skip("prometheus is not installed (just setup)")
    rule = system.json(
        "alert", "rule", "add", "console-hot", "--series", "gpufleet_gpu_temperature_celsius",
        "--compare", ">", "--threshold", "85", "--for", "1s", "--scope", "owner",
        "--annotation", "summary=GPU {{ $labels.gpu }} at {{ $value }} C",
    )  # fmt: skip
    # the simulated GPU's control file (in the agent's state directory) raises its temperature
    control = system.root / "agent" / "simulated-telemetry.json"
    control.write_text(json.dumps({"gpus": {"0": {"temperature_c": 95}}}))
    firing = ListAlerts(state=AlertState.firing)

    seen: list[dict[str, Any]] = []

    def asked(request: ListAlerts | RemoveAlertRule) -> dict[str, Any] | None:
        # from a thread of its own: Playwright's event loop runs in this one
        with ThreadPoolExecutor(1) as asker:
            return asker.submit(system.ask, request.SUBJECT, request.to_bytes()).result()

    def fired() -> bool:
        listed = (asked(firing) or {}).get("alerts") or []
        seen.extend(a for a in listed if a["rule_id"] == rule["id"])
        return bool(seen)

    try:
        wait_for(fired, timeout=30, interval=0.5, message="the temperature rule did not fire")
        alert = seen[0]
        assert alert["labels"]["node"] == NODE_NAME and alert["fired_at"], alert
        page = signed_in(browser, console.login_link(system.cli_env))
        page.goto(f"{console.url}/alerts")
        row = page.wait_for_selector(f'tr[data-alert="{alert["id"]}"]', timeout=10_000)
        shown = row.inner_text()
        assert "firing" in shown and "console-hot" in shown, shown
        assert "GPU 0 at 95 C" in shown, shown
        page.screenshot(path=str(console.shots / "alerts.png"))
    finally:
        control.unlink(missing_ok=True)
        asked(RemoveAlertRule(rule=rule["id"]))  # its alert resolves


def test_an_operator_sees_every_account_and_signing_out_ends_the_session(
    console: Console, browser: Any, system: System, other: dict[str, Any]
) -> None:
    operator = {**system.env, "GPUFLEET_NATS_CREDS": str(system.nats.creds("operator"))}
    link = console.login_link(operator)
    page = signed_in(browser, link)
    page.wait_for_selector(f'[data-node="{NODE_NAME}"]')
    page.wait_for_selector(f'#queue tr[data-job="{other["job"]}"]')
    assert OTHER_NODE in page.content()
    page.screenshot(path=str(console.shots / "operator.png"))
    owners = {n["owner"] for r in api(page, "/api/fleet")["regions"] for n in r["nodes"]}
    assert {identities.LOCAL_ACCOUNT, OTHER} <= owners
    assert {identities.LOCAL_ACCOUNT, OTHER} <= set(api(page, "/api/accounts"))
    shown = api(page, f"/api/jobs/{other['job']}?account={OTHER}")
    assert shown["job"]["owner"] == OTHER
    # the accounts page: one added, then removed once confirmed; one holding a node refused
    page.goto(f"{console.url}/admin")
    page.fill("input[name=account]", GONE)
    page.click("text=Add account")
    page.once("dialog", lambda dialog: dialog.accept())
    page.wait_for_selector(f'button[data-account="{GONE}"]').click()
    page.wait_for_selector(f'button[data-account="{GONE}"]', state="detached")
    assert GONE not in api(page, "/api/accounts")
    page.once("dialog", lambda dialog: dialog.accept())
    page.click(f'button[data-account="{OTHER}"]')
    page.wait_for_selector("text=still has 1 node(s)")
    assert OTHER in api(page, "/api/accounts")
    page.screenshot(path=str(console.shots / "accounts.png"))
    # the link was spent by this sign-in; signing out drops the session
    again = browser.new_context().new_page()
    assert again.goto(link).status == 401
    page.click("#logout")
    page.wait_for_selector("text=Sign in to the gpufleet console")
    api(page, "/api/me", 401)
