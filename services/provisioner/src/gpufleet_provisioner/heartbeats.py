"""What the provisioner heard of each node's heartbeats, and whether it is itself behind:
pure bookkeeping in memory (liveness.py reads it and writes the store).

Every time the book keeps is the provisioner's *monotonic* clock (issue 16): a stepped
wall clock neither makes healthy nodes look silent for an hour (a step forward) nor keeps
a dead one alive for an hour (a step back). The node's own `at` (its wall clock) is used
only for lateness, against its own usual offset.

A node is judged silent only on evidence the node itself could not send: the silence
counts from the later of its last heartbeat heard and the last moment the provisioner was
*behind* with heartbeats (it could not have heard them then, whatever the node did):

- a heartbeat handled late: its age when handled (our clock less its `at`, the node's send
  time) more than `late_ms` above the least age seen from that node (the clocks' offset and
  the network's own delay, learnt per node, so skewed clocks do not count);
- a sweep that ran late: the loop that handles heartbeats was busy or blocked, and the
  heartbeats queued meanwhile are not handled yet.

A node's clock stepped back (or drifting slow) makes all its heartbeats look late from then
on, which would keep the provisioner "behind", judging no node, for good. A backlog drains;
a clock step does not: when a node's heartbeats have been late without a break for
`relearn_ms`, its offset is learnt anew (the least age of that run) and they stop counting.
So a node's clock stepped back delays the judging of silent nodes by at most `relearn_ms`
plus the loss window, once.

The node's `seq` (its heartbeats counted since its agent started) tells, when it is heard
again, whether it sent any in its silence (`missed`): heartbeats lost on the way, or none
sent at all (the node or its network stopped).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Heard:
    heard_ms: int  # our monotonic clock, when handled
    sent_ms: int  # the node's clock: its `at`
    seq: int | None
    least_age_ms: int  # the least (heard - sent) seen from this node: its offset
    wall_ms: int | None = None  # our wall clock when handled: `last_seen_ms` in the store
    late_since_ms: int | None = None  # heard late without a break since (monotonic)
    run_least_ms: int = 0  # the least age of that run of late heartbeats


class HeartbeatBook:
    def __init__(self, started_ms: int, late_ms: int = 1000, relearn_ms: int = 10_000) -> None:
        self.nodes: dict[str, Heard] = {}
        self.late_ms = late_ms
        self.relearn_ms = relearn_ms
        self.behind_ms = started_ms  # heartbeats sent before this may not have been heard
        self.behind_count = 0  # times we found ourselves behind (metrics, tests)
        self.worst_late_ms = 0  # the largest lateness seen
        self.relearnt = 0  # offsets learnt anew: nodes' clocks stepped (tests, logs)
        self.noticed: dict[str, int] = {}  # nodes asked about before any heartbeat heard

    def heard(
        self, minion: str, sent_ms: int, seq: int | None, now_ms: int, wall_ms: int | None = None
    ) -> int | None:
        """A heartbeat handled now (`now_ms`: monotonic). Returns how many of the node's
        heartbeats since the last one heard never arrived (None: unknown, no sequence
        numbers)."""
        age = now_ms - sent_ms
        before = self.nodes.get(minion)
        least = age if before is None else min(before.least_age_ms, age)
        late = age - least
        since, run_least, relearnt = None, age, False
        if late > self.late_ms:
            if before is not None and before.late_since_ms is not None:
                since, run_least = before.late_since_ms, min(before.run_least_ms, age)
            else:
                since = now_ms
            if now_ms - since >= self.relearn_ms:  # late for that long: its clock moved
                least, since, relearnt = run_least, None, True
                late = age - least
                self.relearnt += 1
        if late > self.late_ms:
            self.was_behind(now_ms, late)
        self.worst_late_ms = max(self.worst_late_ms, late)
        missed: int | None = None
        counted_later = False
        if before is not None and before.seq is not None and seq is not None:
            missed = max(0, seq - before.seq - 1) if seq > before.seq else None
            counted_later = seq > before.seq
        # The newest heard replaces what we had; an older one (sent before it, reordered on
        # the way) changes nothing. Newer: sent later, or counted later by its agent (its
        # clock stepped back), or its clock just learnt anew.
        newer = before is None or before.sent_ms <= sent_ms or counted_later or relearnt
        if newer or before is None:
            self.nodes[minion] = Heard(now_ms, sent_ms, seq, least, wall_ms, since, run_least)
        else:
            before.least_age_ms = least
            before.late_since_ms, before.run_least_ms = since, run_least
        return missed

    def was_behind(self, now_ms: int, late_ms: int = 0) -> None:
        self.behind_ms = max(self.behind_ms, now_ms)
        self.behind_count += 1
        self.worst_late_ms = max(self.worst_late_ms, late_ms)

    def silent_ms(self, minion: str, now_ms: int) -> int:
        """How long the node has been silent on evidence it could not send: since the later
        of its last heartbeat heard by this process and the last time we were behind (never
        before this process started). A node not heard yet is silent since it was first
        asked about (a node registered an hour after we started is not silent for an hour:
        its wall-clock `last_seen_ms` is not ours to compare)."""
        heard = self.nodes.get(minion)
        last = heard.heard_ms if heard is not None else self.noticed.setdefault(minion, now_ms)
        return now_ms - max(last, self.behind_ms)
