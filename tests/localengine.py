"""A third engine, for tests only: a job's process group on this machine, started without SSH.

Implements :class:`pipeline.engines.base.Engine`, registered as ``engine = "local"`` on import; no other module knows it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from pipeline.config import JobConfig
from pipeline.engines.base import Entry, Observation, Reads, Sighting, register
from pipeline.engines.steplog import StepLog
from pipeline.errors import PitstopError
from pipeline.host.contract import HangAnswer
from pipeline.host.probe import CRASH_BYTES, JobProbe, LogChunk
from pipeline.host.remote import RemoteHosts
from pipeline.state.runs import RunRecord
from pipeline.verdict import Outcome, Step

Cur = Mapping[str, str]  #: a job's current record


def _alive(pid: int | None) -> bool:
    try:
        return pid is not None and Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _pid(current: Mapping[str, str] | None) -> int | None:
    live = current and current.get("state") != "stopped" and current.get("pid")
    return int(live) if live else None


def _size(path: str) -> int:
    return os.path.getsize(path) if os.path.exists(path) else 0


class LocalEngine:
    """``engine = "local"``: one process group on the machine Pitstop runs on."""

    def __init__(self, ssh: RemoteHosts, steps: StepLog) -> None:
        self.steps = steps  # (no SSH: the processes are local)

    def remember_old(self, run: RunRecord, current: Mapping[str, str]) -> None:
        """The old run's pid."""
        run.old_pid = _pid(current)

    async def preflight(
        self,
        run: RunRecord,
        name: str,
        job: JobConfig,
        wants: Mapping[str, str],
        texts: Mapping[str, str],
        *,
        running: Mapping[str, str] | None = None,
    ) -> Mapping[str, bool]:
        """The workdir exists; a ``running`` record's process is gone."""
        rec = await self.steps.begin(run, Step.PREFLIGHT)
        check, detail = "workdir", f"{job.workdir}: no such directory"
        if Path(job.workdir).is_dir():
            check, detail = "running", f"{name} is already running (pid {_pid(running)}) - use restart"
            if not _alive(_pid(running)):
                await self.steps.end(run, rec, Outcome.OK, "ok: workdir")
                return {}
        raise await self.steps.refuse(run, rec, name, check, detail)

    async def stop(self, run: RunRecord, name: str, job: JobConfig, current: Mapping[str, str]) -> None:
        """SIGTERM to the recorded session, until it is gone (``stop_timeout``), then SIGKILL."""
        rec = await self.steps.begin(run, Step.STOP)
        pid, detail = _pid(current), "nothing was running"  # by its recorded session, never by pattern
        if pid is not None and _alive(pid):
            for sig, wait in ((signal.SIGTERM, job.stop_timeout), (signal.SIGKILL, 5.0)):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, sig)
                deadline = time.monotonic() + wait
                while _alive(pid) and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
            detail = f"stopped pid {pid}"
        await self.steps.mark_stopped(name, run)
        await self.steps.end(run, rec, Outcome.OK, detail)

    async def launch(self, run: RunRecord, name: str, job: JobConfig, current: Mapping[str, str]) -> None:
        """Start ``launch`` in the workdir, in a session of its own, output appended to ``log``."""
        rec = await self.steps.begin(run, Step.LAUNCH)
        run.log_size_at_launch = _size(job.log)
        with open(job.log, "ab") as out:
            proc = await asyncio.create_subprocess_exec(
                *job.launch, cwd=job.workdir, stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=out,
                start_new_session=True,
            )  # fmt: skip
        pid = run.pid = run.sid = proc.pid
        run.launched_at = time.time()
        record = {"run_id": run.id, "pid": str(pid), "sid": str(pid), "state": "running", "log": job.log}
        await self.steps.record_launch(run, name, record, run.launched_at + job.start_window)
        await self.steps.end(run, rec, Outcome.OK, f"pid {pid}, log {job.log}")

    async def observe(self, run: RunRecord, name: str, job: JobConfig, *, complete: bool) -> Observation:
        """Whether the pid lives, the output since launch, its first error line (no exit status)."""
        alive = _alive(run.pid)
        text = Path(job.log).read_bytes()[run.log_size_at_launch or 0 :].decode(errors="replace")
        return Observation(
            "alive" if alive else "gone", int(alive), job.processes, pid=run.pid, sampled_at=time.time(),
            started_at=run.launched_at, new_bytes=len(text.encode()), tail="\n".join(text.splitlines()[-30:]),
            error_line=next((ln for ln in text.splitlines() if "Error" in ln), None),
            facts=(f"pid {run.pid}: {'alive' if alive else 'gone'}",),
        )  # fmt: skip

    async def observe_many(self, entries: Sequence[Entry], reads: Reads | None = None) -> dict[str, Sighting]:
        """Each job's recorded pid and its log's size (``reads`` left to the watcher)."""
        out: dict[str, Sighting] = {}
        for name, job, current in entries:
            pid = _pid(current)
            pids = (pid,) if pid is not None and _alive(pid) else ()
            probe = JobProbe(name, pids, len(pids), log_size=_size(job.log), sampled_at=time.time())
            out[name] = Sighting(
                probe, job.processes, "alive" if pids else "gone" if pid else "none", pid=pid
            )
        return out

    async def log_tail(self, name: str, job: JobConfig, current: Mapping[str, str], lines: int) -> str:
        """The log's last ``lines`` lines."""
        return "\n".join(Path(job.log).read_text().splitlines()[-lines:])

    async def node_outputs(self, name: str, job: JobConfig, cur: Cur, argv: Sequence[str]) -> None:
        """None: the job holds no nodes of its own."""

    async def crash_evidence(
        self, name: str, job: JobConfig, cur: Cur, offset: int, seen: JobProbe | None
    ) -> JobProbe:
        """The log's last CRASH_BYTES since ``offset``; no exit record."""
        data, size = Path(job.log).read_bytes()[offset:][-CRASH_BYTES:], _size(job.log)
        return JobProbe(name, log_size=size, crash=LogChunk(data, size, size, None, False))

    async def hang_evidence(self, name: str, job: JobConfig, cur: Cur, pids: Sequence[int]) -> HangAnswer:
        """Not looked at for a local job."""
        raise PitstopError(f"no hang evidence for {name}: the local engine does not look")


register("local", LocalEngine)
