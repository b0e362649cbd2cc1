"""What the agent reports of a worker: its start, its log in chunks, its upload, its end,
each sent with a message id of its own so that a copy re-sent after a crash is dropped by
JetStream; and how far its staging is, at most once a second (progress.py), which nothing
re-sends: only the latest matters."""

from __future__ import annotations

import asyncio
from datetime import datetime
from pathlib import Path
from typing import Any

from gpufleet_bus.publish import Publisher, publish, publish_raw
from gpufleet_contracts import subjects
from gpufleet_contracts.clock import Clock
from gpufleet_contracts.jobs import (
    WorkerFinished,
    WorkerStaging,
    WorkerStarted,
    WorkerState,
    WorkerUploading,
)

from . import logcap
from .files import read_int, write_text_atomic
from .layout import UPLOAD_FAILED
from .workdir import Worker

LOG_TYPE = "gpufleet.worker.log.v1"
LOG_TAIL_CHARS = 4000
# A reason is cut to this: a report must fit the REPORTS stream's 64 KiB a message (a log
# tail of 4000 characters is at most ~24 KB of JSON), or it could never be sent.
REASON_CHARS = 2000
CHUNKS_PER_POLL = 64  # per worker and round, so one chatty worker cannot starve the others
STAGING_EVERY_S = 1.0  # a worker's WorkerStaging, at most this often


def _parse_time(value: Any) -> datetime | None:
    try:
        return datetime.fromisoformat(str(value)) if value else None
    except ValueError:
        return None


def log_tail(path: Path, chars: int = LOG_TAIL_CHARS) -> str:
    try:
        with path.open("rb") as f:
            f.seek(max(0, path.stat().st_size - chars * 4))
            data = f.read()
    except OSError:
        return ""
    return data.decode(errors="replace")[-chars:]


class Reports:
    """The reporting half of WorkerManager (manager.py), which sets these."""

    minion_id: str
    broker: Publisher
    source: str
    clock: Clock
    log_chunk_bytes: int
    log_max_bytes: int

    async def _report_started(self, w: Worker, started: dict[str, Any]) -> None:
        evt = WorkerStarted(
            job_id=w.job_id,
            worker=w.worker,
            placement_id=w.placement_id,
            minion_id=self.minion_id,
            pid=started.get("pid"),
            started_at=_parse_time(started.get("started_at")) or self.clock(),
        )
        await publish(self.broker, evt, source=self.source, msg_id=f"started:{w.placement_id}")
        w.file("reported_started").touch()
        w.reported_started = True

    async def ship_log(self, w: Worker) -> bool:
        """Publish new log bytes, all of a round's chunks at once (their acks awaited
        together); True when everything written so far is published. `log.pending` marks
        the end of the batch in flight: after a crash the same bytes go again, cut at the
        same places, under the same ids (JetStream drops the copies it has)."""
        path = w.file("log")
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            return True
        cap = self.log_max_bytes  # logcap.py: what is kept and shipped, at most
        if size == w.log_shipped and size <= cap:
            return True  # nothing new since the last round: no file read
        logcap.bound(path, size, cap)
        subject = subjects.log(self.minion_id, w.job_id, w.worker)
        offset = read_int(w.file("log.offset")) or 0
        pending = read_int(w.file("log.pending"))
        if pending is not None and pending > offset:
            end = pending
        else:
            end = min(size, offset + CHUNKS_PER_POLL * self.log_chunk_bytes, cap)
            if end <= offset:
                w.log_shipped = offset
                if size > cap and not w.file("log.capped").exists():
                    await publish_raw(
                        self.broker,
                        subject,
                        logcap.notice(cap),
                        type_=LOG_TYPE,
                        source=self.source,
                        msg_id=f"{w.placement_id}:capped",
                    )
                    w.file("log.capped").touch()
                return True
            write_text_atomic(w.file("log.pending"), str(end))
        with path.open("rb") as f:
            f.seek(offset)
            data = f.read(end - offset)
        step = self.log_chunk_bytes
        await asyncio.gather(
            *(
                publish_raw(
                    self.broker,
                    subject,
                    data[i : i + step],
                    type_=LOG_TYPE,
                    source=self.source,
                    msg_id=f"{w.placement_id}:{offset + i}",
                )
                for i in range(0, len(data), step)
            )
        )
        write_text_atomic(w.file("log.offset"), str(end))
        w.log_shipped = end
        return end >= size and not (size > cap and not w.file("log.capped").exists())

    async def _report_uploading(self, w: Worker) -> None:
        """Once per upload (its message id dedups one re-sent after a restart)."""
        assert w.uploading_at is not None
        evt = WorkerUploading(
            job_id=w.job_id,
            worker=w.worker,
            placement_id=w.placement_id,
            minion_id=self.minion_id,
            at=w.uploading_at,
        )
        await publish(self.broker, evt, source=self.source, msg_id=f"uploading:{w.placement_id}")
        w.reported_uploading = True

    async def report_staging(self, w: Worker, now: float) -> None:
        """The worker's staging as it is now, if it changed and a second has passed since the
        last one sent (`now`: monotonic). One that fails is not retried: the next change is."""
        if w.staging_seq == w.staging_sent or now - w.staging_sent_at < STAGING_EVERY_S:
            return
        seq = w.staging_seq
        w.staging_sent, w.staging_sent_at = seq, now
        evt = WorkerStaging(
            job_id=w.job_id,
            worker=w.worker,
            placement_id=w.placement_id,
            minion_id=self.minion_id,
            at=self.clock(),
            items=list(w.staging.values())[:64],
        )
        await publish(
            self.broker, evt, source=self.source, msg_id=f"staging:{w.placement_id}:{seq}"
        )

    def finished_event(
        self, w: Worker, exit_data: dict[str, Any], started: dict[str, Any] | None
    ) -> WorkerFinished:
        code = exit_data.get("exit_code")
        reason = exit_data.get("reason") or exit_data.get("error")
        if exit_data.get("stopped"):
            state = WorkerState.stopped
            if not reason and w.file("stop_requested").exists():
                reason = w.file("stop_requested").read_text().strip() or None
            reason = reason or "stopped"
        elif exit_data.get("lost") or exit_data.get("error") or code is None:
            state = WorkerState.failed
            reason = reason or "worker ended without an exit code"
        elif code == 0:
            state = WorkerState.finished
        else:
            state = WorkerState.failed
            if reason:  # the runtime's (podman: "out of memory")
                pass
            elif exit_data.get("signal"):
                reason = f"killed by signal {exit_data.get('signal_name') or exit_data['signal']}"
            else:
                reason = f"exited with code {code}"
        upload = w.file(UPLOAD_FAILED)
        if state is not WorkerState.stopped and upload.exists():  # outputs.py: its output
            why = upload.read_text().strip() or "output upload failed"
            reason = why if state is WorkerState.finished else f"{reason}; {why}"
            state = WorkerState.failed
        return WorkerFinished(
            job_id=w.job_id,
            worker=w.worker,
            placement_id=w.placement_id,
            minion_id=self.minion_id,
            state=state,
            exit_code=code,
            reason=str(reason)[:REASON_CHARS] if reason else reason,
            started_at=_parse_time((started or {}).get("started_at")),
            ended_at=_parse_time(exit_data.get("ended_at")) or self.clock(),
            log_tail=log_tail(w.file("log")),
        )
