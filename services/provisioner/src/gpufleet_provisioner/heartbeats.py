"""What the provisioner heard of each node's heartbeats, and whether it is itself behind:
pure bookkeeping in memory (liveness.py reads it and writes the store).

A node is judged silent only on evidence the node itself could not send: the silence
counts from the later of its last heartbeat heard and the last moment the provisioner was
*behind* with heartbeats (it could not have heard them then, whatever the node did):

- a heartbeat handled late: its age when handled (our clock less its `at`, the node's send
  time) more than `late_ms` above the least age ever seen from that node (the clocks'
  offset and the network's own delay, learnt per node, so skewed clocks do not count);
- a sweep that ran late: the loop that handles heartbeats was busy or blocked, and the
  heartbeats queued meanwhile are not handled yet.

The node's `seq` (its heartbeats counted since its agent started) tells, when it is heard
again, whether it sent any in its silence (`missed`): heartbeats lost on the way, or none
sent at all (the node or its network stopped).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Heard:
    heard_ms: int  # our clock, when handled
    sent_ms: int  # the node's clock: its `at`
    seq: int | None
    least_age_ms: int  # the least (heard - sent) seen from this node


class HeartbeatBook:
    def __init__(self, started_ms: int, late_ms: int = 1000) -> None:
        self.nodes: dict[str, Heard] = {}
        self.late_ms = late_ms
        self.behind_ms = started_ms  # heartbeats sent before this may not have been heard
        self.behind_count = 0  # times we found ourselves behind (metrics, tests)
        self.worst_late_ms = 0  # the largest lateness seen

    def heard(self, minion: str, sent_ms: int, seq: int | None, now_ms: int) -> int | None:
        """A heartbeat handled now. Returns how many of the node's heartbeats since the last
        one heard never arrived (None: unknown, no sequence numbers)."""
        age = now_ms - sent_ms
        before = self.nodes.get(minion)
        least = age if before is None else min(before.least_age_ms, age)
        late = age - least
        if late > self.late_ms:
            self.was_behind(now_ms, late)
        self.worst_late_ms = max(self.worst_late_ms, late)
        missed: int | None = None
        if before is not None and before.seq is not None and seq is not None:
            missed = max(0, seq - before.seq - 1) if seq > before.seq else None
        if before is None or before.sent_ms <= sent_ms:  # an older one changes nothing
            self.nodes[minion] = Heard(now_ms, sent_ms, seq, least)
        else:
            before.least_age_ms = least
        return missed

    def was_behind(self, now_ms: int, late_ms: int = 0) -> None:
        self.behind_ms = max(self.behind_ms, now_ms)
        self.behind_count += 1
        self.worst_late_ms = max(self.worst_late_ms, late_ms)

    def silent_ms(self, minion: str, stored_seen_ms: int | None, now_ms: int) -> int:
        """How long the node has been silent on evidence it could not send: since the later
        of its last heartbeat heard (here or, from before this process, as stored) and the
        last time we were behind."""
        heard = self.nodes.get(minion)
        last = max(heard.heard_ms if heard is not None else 0, stored_seen_ms or 0, self.behind_ms)
        return now_ms - last
