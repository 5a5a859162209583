"""A third engine, for tests only: a job's process group on this machine, with no SSH host at all.

An :class:`~pipeline.engines.base.EngineKind`: a runner built with ``{**ENGINES, "local": LocalEngine}``
knows it; no other module does."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import shutil
import signal
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from pipeline.config import JobConfig
from pipeline.engines.base import Entry, Observation, Plan, Reads, Sighting, Target
from pipeline.engines.steplog import StepLog
from pipeline.engines.workdir import step_patches
from pipeline.errors import PitstopError
from pipeline.host.contract import HangAnswer
from pipeline.host.helper import op_read
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


def _pid(current: Cur | None) -> int | None:
    live = current and current.get("state") != "stopped" and current.get("pid")
    return int(live) if live else None


def _read(path: str, offset: int, max_bytes: int, inode: int | None = None) -> LogChunk:
    got = op_read(
        {"path": path, "offset": offset, "max_bytes": max_bytes, "inode": inode}
    )  # the helper's read, here
    if "error" in got:  # not written yet
        return LogChunk(b"", 0, 0, None, False)
    return LogChunk(base64.b64decode(got["data"]), got["offset"], got["size"], got["inode"], got["reset"])


class LocalEngine:
    """``engine = "local"``: one process group on the machine Pitstop runs on."""

    def __init__(self, ssh: RemoteHosts, steps: StepLog) -> None:
        self.steps = steps  # (no SSH: the processes are local)

    @staticmethod
    def check(job: JobConfig, at: str) -> list[str]:
        """Any job suits it."""
        return []

    async def preflight(self, run: RunRecord, t: Target, plan: Plan) -> Mapping[str, bool]:
        """The workdir exists, no patch is to change; (a start) the recorded process is gone."""
        name, job, running_pid = t.name, t.job, _pid(t.current) if plan.start else None
        rec = await self.steps.begin(run, Step.PREFLIGHT)
        check, detail = "workdir", f"{job.workdir}: no such directory"
        if any(w != "state" for w in plan.wants.values()):
            check, detail = "patch", "the local engine applies no patches"
        elif Path(job.workdir).is_dir():
            check, detail = "running", f"{name} is already running (pid {running_pid}) - use restart"
            if not _alive(running_pid):
                await self.steps.end(run, rec, Outcome.OK, "ok: workdir")
                return {}
        raise await self.steps.refuse(run, rec, name, check, detail)

    async def stop(self, run: RunRecord, t: Target) -> None:
        """SIGTERM to the recorded session, until it is gone (``stop_timeout``), then SIGKILL."""
        job = t.job
        run.old_pid = _pid(t.current)
        rec = await self.steps.begin(run, Step.STOP)
        pid, detail = run.old_pid, "nothing was running"  # by its recorded session, never by pattern
        if pid is not None and _alive(pid):
            for sig, wait in ((signal.SIGTERM, job.stop_timeout), (signal.SIGKILL, 5.0)):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, sig)
                deadline = time.monotonic() + wait
                while _alive(pid) and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
            detail = f"stopped pid {pid}"
        await self.steps.records.mark_stopped(t.name, run.id)
        await self.steps.end(run, rec, Outcome.OK, detail)

    async def clear_cache(self, run: RunRecord, t: Target) -> None:
        """Remove the ``clear_cache`` paths when ``run.fresh_cache``."""
        job, fresh = t.job, run.fresh_cache
        rec = await self.steps.begin(run, Step.CLEAR_CACHE)
        for path in job.clear_cache if fresh else ():
            shutil.rmtree(path, ignore_errors=True)
        done = "removed " + ", ".join(job.clear_cache) if fresh and job.clear_cache else None
        await self.steps.end(run, rec, Outcome.OK if done else Outcome.SKIPPED, done or "not asked for")

    async def patch(self, run: RunRecord, t: Target, plan: Plan, applied: Mapping[str, bool]) -> None:
        """Nothing to change (pre-flight refused any): SKIPPED, no patch in effect."""
        rec = await self.steps.begin(run, Step.PATCH)
        await self.steps.end(run, rec, Outcome.SKIPPED, step_patches([], [], []))

    async def patches_applied(self, name: str, job: JobConfig, texts: Cur) -> list[str]:
        """None: the local engine applies no patches."""
        return []

    async def read_chunk(self, name: str, job: JobConfig, offset: int, length: int, *, path: str) -> LogChunk:
        """The bytes of the local file, as the host helper reads them; a missing file reads empty."""
        return _read(path, offset, length)

    async def launch(self, run: RunRecord, t: Target) -> None:
        """Start ``launch`` in the workdir, in a session of its own, output appended to ``log``."""
        job = t.job
        rec = await self.steps.begin(run, Step.LAUNCH)
        run.log_size_at_launch = _read(job.log, 0, 0).size
        with open(job.log, "ab") as out:
            proc = await asyncio.create_subprocess_exec(
                *job.launch, cwd=job.workdir, stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=out,
                start_new_session=True,
            )  # fmt: skip
        pid = run.pid = run.sid = proc.pid
        run.launched_at = time.time()
        record = {"run_id": run.id, "pid": str(pid), "sid": str(pid), "state": "running", "log": job.log}
        await self.steps.records.record_launch(run.id, t.name, record, run.launched_at + job.start_window)
        await self.steps.end(run, rec, Outcome.OK, f"pid {pid}, log {job.log}")

    async def observe(self, run: RunRecord, t: Target, *, complete: bool) -> Observation:
        """Whether the pid lives, the output since launch, its first error line (no exit status)."""
        job = t.job
        alive = _alive(run.pid)
        text = Path(job.log).read_bytes()[run.log_size_at_launch or 0 :].decode(errors="replace")
        return Observation(
            "alive" if alive else "gone", int(alive), job.processes, pid=run.pid, sampled_at=time.time(),
            started_at=run.launched_at, new_bytes=len(text.encode()), tail="\n".join(text.splitlines()[-30:]),
            error_line=next((ln for ln in text.splitlines() if "Error" in ln), None),
            facts=(f"pid {run.pid}: {'alive' if alive else 'gone'}",),
        )  # fmt: skip

    async def observe_many(self, entries: Sequence[Entry], reads: Reads | None = None) -> dict[str, Sighting]:
        """Each job's recorded pid, its log's size and, while it runs, the bytes ``reads`` asks for."""
        out: dict[str, Sighting] = {}
        for name, job, current in entries:
            pid = _pid(current)
            pids = (pid,) if pid is not None and _alive(pid) else ()
            want = (reads or {}).get(name) if pids else None
            read = _read(want["path"], want["offset"], want["max_bytes"], want["inode"]) if want else None
            probe = JobProbe(name, pids, len(pids), log_size=_read(job.log, 0, 0).size, sampled_at=time.time(),
                             read=read)  # fmt: skip
            out[name] = Sighting(probe, job.processes, "alive" if pids else "gone" if pid else "none",
                                 pid=pid)  # fmt: skip
        return out

    async def log_tail(self, t: Target, lines: int) -> str:
        """The log's last ``lines`` lines."""
        return "\n".join(Path(t.job.log).read_text().splitlines()[-lines:])

    async def node_outputs(self, t: Target, argv: Sequence[str]) -> None:
        """None: the job holds no nodes of its own."""

    async def crash_evidence(self, t: Target, offset: int, seen: JobProbe | None) -> JobProbe:
        """The log's last CRASH_BYTES since ``offset``; no exit record."""
        got = _read(t.job.log, offset, 1 << 40)
        return JobProbe(
            t.name,
            log_size=got.size,
            crash=LogChunk(got.data[-CRASH_BYTES:], got.size, got.size, None, False),
        )

    async def hang_evidence(self, t: Target, pids: Sequence[int]) -> HangAnswer:
        """Not looked at for a local job."""
        raise PitstopError(f"no hang evidence for {t.name}: the local engine does not look")
