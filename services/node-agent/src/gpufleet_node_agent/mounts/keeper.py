"""The datastores mounted on this node: mounted when a worker first holds one, probed every
round while mounted, healed without an agent restart, and unmounted once nobody holds them.

A datastore's mount details come from the datastore service (`ask`: MountDatastore, which
answers only for this node's own region and owner), asked again at every (re)mount so that
an SMB password is opened (`open_password`, the node's sealing key) only for the mount
command and kept nowhere. Each is mounted at `<base>/<hash of its name>`.

A round (`heal`) probes each mount in a bounded child process (port.py). A mount that is
unreachable or stale is detached lazily (`umount -l`: whatever still reads it lets go
later) and mounted again at once; while that fails the datastore is `unreachable`, its
`reason` is what its waiting workers show, and the next round tries again. A probe still
running from the last round counts as unreachable and is not started twice. With the round
every PROBE_S and a probe's time bounded, a server that stops answering is seen within
PROBE_S + the probe's timeout (20 + 10 s by default: under a minute).

Datastores the operator mounted by hand (GPUFLEET_REGIONAL_DATASTORES) are `roots` from the
start and never probed, mounted or unmounted here.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from gpufleet_contracts.datastores import DatastoreMount, SealedPassword

from .port import Health, Mounter, NoDatastore, Unreachable

log = logging.getLogger("gpufleet.node_agent.datastores")

AskMount = Callable[[str], Awaitable[DatastoreMount]]
OpenPassword = Callable[[SealedPassword], str]


def unreachable(name: str) -> str:
    return f"datastore {name} unreachable"


@dataclass
class Held:
    """One datastore this keeper mounted: who holds it, and how it was last found."""

    at: Path
    spec: DatastoreMount | None = None
    holders: set[str] = field(default_factory=set)
    health: Health = Health.unreachable
    why: str = ""
    gone: bool = False  # the datastore service knows no such datastore (NoDatastore)
    probing: asyncio.Task[Health] | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class DatastoreMounts:
    def __init__(
        self,
        mounter: Mounter,
        base: Path,
        ask: AskMount,
        open_password: OpenPassword,
        static: Mapping[str, Path] | None = None,
    ) -> None:
        self.mounter = mounter
        self.base = base
        self.ask = ask
        self.open_password = open_password
        self.static = dict(static or {})
        # what the staging reads a datastore from (staging/datastores.py): the operator's
        # roots, and each mount of this keeper's while it answers
        self.roots: dict[str, Path] = dict(self.static)
        self.held: dict[str, Held] = {}

    def reason(self, name: str) -> str | None:
        """Why a worker that needs `name` waits (`datastore nas unreachable`), or None."""
        h = self.held.get(name)
        if h is None or h.health is Health.ok:
            return None
        return unreachable(name)

    def _held(self, name: str) -> Held:
        h = self.held.get(name)
        if h is None:
            digest = hashlib.sha256(name.encode()).hexdigest()[:24]
            h = self.held[name] = Held(at=self.base / digest)
        return h

    async def hold(self, name: str, holder: str) -> Path:
        """`name` mounted (now, if it was not) and held by `holder`: where it is, or
        Unreachable (the holder is kept: the keeper's rounds go on trying), or NoDatastore."""
        if name in self.static:
            return self.static[name]
        h = self._held(name)
        h.holders.add(holder)
        async with h.lock:
            if h.health is not Health.ok:
                await self._mount(name, h)
        if h.gone:
            raise NoDatastore(h.why)
        if h.health is not Health.ok:
            raise Unreachable(h.why or unreachable(name))
        return h.at

    async def release(self, name: str, holder: str) -> None:
        """`holder` no longer needs `name`; the last one out unmounts it. Safe twice."""
        h = self.held.get(name)
        if h is None or holder not in h.holders:
            return
        h.holders.discard(holder)
        if h.holders:
            return
        async with h.lock:
            if h.holders:  # held again meanwhile
                return
            self.roots.pop(name, None)
            self.held.pop(name, None)
            try:
                await self.mounter.unmount(h.at)
            except Unreachable as exc:
                log.warning("datastore %s: %s", name, exc.reason)

    async def heal(self) -> None:
        """One round: every held mount probed; a bad one detached and mounted again."""
        for name, h in list(self.held.items()):
            if h.lock.locked():
                continue  # being mounted or released now
            async with h.lock:
                health = await self._probe(h) if h.health is Health.ok else h.health
                if health is Health.ok:
                    continue
                if h.health is Health.ok:
                    log.warning("datastore %s: %s; mounting it again", name, health.value)
                await self._mount(name, h)

    async def _probe(self, h: Held) -> Health:
        if h.spec is None:
            return Health.unreachable
        if h.probing is not None and not h.probing.done():
            return Health.unreachable  # the last probe still hangs: not started twice
        h.probing = asyncio.ensure_future(self.mounter.probe(h.spec, h.at))
        return await asyncio.shield(h.probing)

    async def _mount(self, name: str, h: Held) -> None:
        """Detach whatever is at `h.at` (lazily), ask for the details again, mount."""
        self.roots.pop(name, None)
        try:
            await self.mounter.unmount(h.at)
            h.at.mkdir(parents=True, exist_ok=True)
            spec = h.spec = await self.ask(name)
            password = self.open_password(spec.password) if spec.password is not None else None
            await self.mounter.mount(spec, h.at, password)
        except (Unreachable, NoDatastore) as exc:
            h.health, h.why, h.gone = Health.unreachable, exc.reason, isinstance(exc, NoDatastore)
            return
        h.health, h.why, h.gone = Health.ok, "", False
        self.roots[name] = h.at
        log.info("datastore %s mounted at %s (%s)", name, h.at, self.mounter.name)
