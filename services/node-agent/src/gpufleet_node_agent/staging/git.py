"""Git sources (model code, R-JOB-4) cloned with the git CLI, shallow: http(s) with the
worker's `git` key (its token in an Authorization header given through GIT_CONFIG_*
variables: never on a command line, in a URL or in the clone's config), or ssh with its
`ssh` key. `url#ref` pins a branch, tag or commit; the commit cloned is recorded in
`<worker_dir>/staged.json`. Its version for the node's content cache (`version`) is the
commit the ref names now, asked with `git ls-remote` and the worker's keys: the same commit
is cloned once per node.

The connection goes to the address the guard checked (http: curl's resolve list; ssh: its
HostName, the host key still checked under the name), redirects are not followed, and only
the http, https and ssh transports are allowed (no file://, no ext::)."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import shlex
import shutil
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from gpufleet_contracts.locations import GitSource, Source

from ..steps.base import WorkerFailed
from ..worker.files import write_json_atomic
from .guard import AddressGuard, url_host
from .meter import Meter, shown, too_large
from .registry import Keys, Transfer

STAGED_FILE = "staged.json"
POLL_S = 0.5
TIMEOUT_S = 1800.0
LS_REMOTE_TIMEOUT_S = 60.0
# `user@host:path`, ssh's short form; never `helper::address` (git's remote helpers)
_SCP = re.compile(r"^(?:(?P<user>[\w.-]+)@)?(?P<host>[A-Za-z0-9][A-Za-z0-9.-]*):(?P<path>[^/:].*)$")
_COMMIT = re.compile(r"^[0-9a-f]{7,40}$")

PROTOCOLS = (
    "protocol.allow=never",
    "protocol.https.allow=always",
    "protocol.http.allow=always",
    "protocol.ssh.allow=always",
    "http.followRedirects=false",
    "core.hooksPath=/dev/null",
    "submodule.recurse=false",
)


@dataclass(frozen=True)
class Remote:
    """A clone URL as git is told it, and where it connects."""

    url: str
    ref: str | None
    host: str
    port: int
    ssh: bool


def remote(text: str) -> Remote:
    url, _, ref = text.partition("#")
    scp = _SCP.match(url) if "://" not in url and "::" not in url else None
    if scp is not None:
        return Remote(url, ref or None, scp["host"], 22, True)
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https", "ssh") or not parts.hostname:
        raise WorkerFailed(f"git source {shown(url)} is not an http(s) or ssh clone URL")
    default = {"http": 80, "https": 443, "ssh": 22}[scheme]
    return Remote(url, ref or None, parts.hostname, parts.port or default, scheme == "ssh")


def _emptied(d: Path) -> None:
    for child in list(d.iterdir()):
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()


def _disk_use(d: Path) -> int:
    total = 0
    for root, _, files in os.walk(d):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                continue
    return total


def _failure(what: str, stderr: str) -> WorkerFailed:
    """Why git failed, from its messages (which never hold the token: it is a header)."""
    text = stderr.lower()
    if "not found" in text or "couldn't find remote ref" in text or "not our ref" in text:
        return WorkerFailed(f"{what} not found")
    if any(s in text for s in ("authentication failed", "error: 403", "error: 401", "denied")):
        return WorkerFailed(f"{what} is forbidden")
    if "host key verification failed" in text:
        return WorkerFailed(f"{what}: its ssh host key is not the known one")
    return WorkerFailed(f"{what}: git could not fetch it")


def _listed(out: str, asked: str) -> str | None:
    """The commit of the first line `git ls-remote` printed (a branch before a tag of the
    same name: refs/heads sorts first), or None."""
    for line in out.splitlines():
        commit, _, ref = line.partition("\t")
        if _COMMIT.fullmatch(commit) and len(commit) == 40 and ref:
            return commit
    return None


def _record(t: Transfer, key: str, r: Remote, commit: str) -> None:
    """The commit a worker's mount got, in `<worker_dir>/staged.json`."""
    if t.worker_dir is None:
        return
    record = t.worker_dir / STAGED_FILE
    staged = json.loads(record.read_text()) if record.exists() else {}
    staged[key] = {"url": shown(r.url), "ref": r.ref, "commit": commit}
    write_json_atomic(record, staged)


@dataclass(frozen=True)
class Git:
    guard: AddressGuard
    ca_file: Path | None = None

    async def _env(self, r: Remote, keys: Keys, t: Transfer) -> tuple[list[str], dict[str, str]]:
        """git's -c options and environment for one clone (what connects, and how)."""
        ip = await self.guard.resolve(r.host, r.port)
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": "/nonexistent",
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_CONFIG_GLOBAL": "/dev/null",
            "GIT_TERMINAL_PROMPT": "0",
            "GIT_ASKPASS": "/bin/false",
            "SSH_ASKPASS": "/bin/false",
            "LC_ALL": "C",
        }
        options = [*PROTOCOLS]
        if r.ssh:
            secrets = t.worker_dir / "secrets" / "ssh" if t.worker_dir else None
            key_file = secrets / "private_key" if secrets else None
            if "ssh" not in keys or key_file is None or not key_file.is_file():
                raise WorkerFailed(f"{shown(r.url)} is forbidden: the job attached no ssh key")
            known = secrets / "known_hosts" if secrets else None
            checking = (
                ["-o", f"UserKnownHostsFile={known}", "-o", "StrictHostKeyChecking=yes"]
                if known is not None and known.is_file()
                else ["-o", "UserKnownHostsFile=/dev/null", "-o", "StrictHostKeyChecking=no"]
            )
            ssh = ["ssh", "-i", str(key_file), "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes"]
            # known_hosts names a host on another port than 22 `[host]:port` (ssh-keyscan -p)
            alias = r.host if r.port == 22 else f"[{r.host}]:{r.port}"
            ssh += ["-o", f"HostName={ip}", "-o", f"HostKeyAlias={alias}", *checking]
            env["GIT_SSH_COMMAND"] = shlex.join(ssh)
            env["GIT_SSH_VARIANT"] = "ssh"
            return options, env
        options.append(f"http.curloptResolve={r.host}:{r.port}:{url_host(ip)}")
        if self.ca_file is not None:
            options.append(f"http.sslCAInfo={self.ca_file}")
        key = keys.get("git") or {}
        if key.get("token"):
            pair = f"{key.get('username') or 'git'}:{key['token']}".encode()
            env["GIT_CONFIG_COUNT"] = "1"
            env["GIT_CONFIG_KEY_0"] = "http.extraHeader"
            env["GIT_CONFIG_VALUE_0"] = f"Authorization: Basic {base64.b64encode(pair).decode()}"
        return options, env

    async def version(self, source: Source, t: Transfer) -> str | None:
        """The commit `url#ref` names now (a pinned commit: itself, once the remote answered
        the worker's keys), or None when the remote does not list the ref (the clone then
        says why)."""
        assert isinstance(source, GitSource)
        r = remote(source.url)
        what = shown(source.url)
        options, env = await self._env(r, t.keys, t)
        pinned = r.ref is not None and len(r.ref) == 40 and _COMMIT.fullmatch(r.ref)
        asked = "HEAD" if pinned or r.ref is None else r.ref
        argv = ["git", *(a for o in options for a in ("-c", o)), "ls-remote", r.url, asked]
        proc = await asyncio.create_subprocess_exec(
            *argv,
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            out, err = await asyncio.wait_for(proc.communicate(), LS_REMOTE_TIMEOUT_S)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise WorkerFailed(f"{what}: git took more than {LS_REMOTE_TIMEOUT_S:.0f} s") from None
        if proc.returncode != 0:
            raise _failure(what, err.decode(errors="replace"))
        commit = _listed(out.decode(errors="replace"), asked)
        if pinned:
            commit = r.ref
        if commit is not None:
            _record(t, t.mount or what, r, commit)
        return commit

    async def fetch(self, source: Source, dest: Path, t: Transfer) -> None:
        assert isinstance(source, GitSource)
        r = remote(source.url)
        what = shown(source.url)
        options, env = await self._env(r, t.keys, t)
        await asyncio.to_thread(_emptied, dest)  # an earlier try's clone: started again
        meter = Meter(what, t)
        git = ["git", *(a for o in options for a in ("-c", o)), "-C", str(dest)]
        await self._run(what, [*git, "init", "-q"], env, dest, meter)
        await self._run(what, [*git, "remote", "add", "origin", r.url], env, dest, meter)
        want = r.ref or "HEAD"
        shallow = [*git, "fetch", "-q", "--depth=1", "--no-tags", "origin", want]
        try:
            await self._run(what, shallow, env, dest, meter)
            checkout = "FETCH_HEAD"
        except WorkerFailed:
            if r.ref is None or not _COMMIT.fullmatch(r.ref):
                raise
            # a commit the server will not send alone: the whole history, then that commit
            await self._run(what, [*git, "fetch", "-q", "--no-tags", "origin"], env, dest, meter)
            checkout = r.ref
        await self._run(what, [*git, "checkout", "-q", "--detach", checkout], env, dest, meter)
        commit = (await self._run(what, [*git, "rev-parse", "HEAD"], env, dest, meter)).strip()
        meter.finish()
        if t.worker_dir is not None:
            rel = (
                str(dest.relative_to(t.worker_dir))
                if dest.is_relative_to(t.worker_dir)
                else str(dest)
            )
            _record(t, t.mount or rel, r, commit)

    async def _run(
        self, what: str, argv: list[str], env: dict[str, str], dest: Path, meter: Meter
    ) -> str:
        """One git command, its clone's size watched: past the limit, killed."""
        proc = await asyncio.create_subprocess_exec(
            *argv,
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        done = asyncio.ensure_future(proc.communicate())
        waited = 0.0
        try:
            while not done.done():
                await asyncio.wait([done], timeout=POLL_S)
                waited += POLL_S
                used = await asyncio.to_thread(_disk_use, dest)
                if used > meter.t.limit_bytes:
                    raise too_large(what, meter.t.limit_bytes)
                if waited > TIMEOUT_S:
                    raise WorkerFailed(f"{what}: git took more than {TIMEOUT_S:.0f} s")
                meter.add(max(0, used - meter.done))
        finally:
            if proc.returncode is None:
                proc.kill()
                await done
        out, err = done.result()
        if proc.returncode != 0:
            raise _failure(what, err.decode(errors="replace"))
        used = await asyncio.to_thread(_disk_use, dest)  # what it wrote since it was last seen
        if used > meter.t.limit_bytes:
            raise too_large(what, meter.t.limit_bytes)
        meter.add(max(0, used - meter.done))
        return out.decode()
