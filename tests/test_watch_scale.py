"""Watching many jobs: one helper call per host per cycle whatever it watches (processes, log
sizes and per-rank progress together), and a slow host neither delays the others nor goes unsaid
(real SSH hosts, real processes, real Redis)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import os
import signal
import subprocess
import time
import zlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from bot.runtime.assembly import build_context, close_context
from handlers.context import Context
from handlers.outbox import MemoryOutbox
from handlers.views.read import status_command
from handlers.watch.cycle import Watcher
from pipeline.config import Config, JobConfig, WatchSettings
from pipeline.host.contract import MARKER, LogRead
from pipeline.host.helper import op_probe
from pipeline.host.probe import helper_argv, helper_input, helper_source, probe_args, probe_host
from pipeline.host.remote import SSHPool
from pipeline.observe.progress import ProgressState
from pipeline.state.incidents import IncidentStore
from pipeline.verdict import Verdict
from tests.fixtures.ssh import HostUnderTest, InProcessHost, start_in_process
from tests.test_watch import open_harness, until

TOKEN = 91_000  #: the jobs' sleepers run ``sleep 91NNN`` (one number per job)


def metric_lines(step: int, ranks: int = 2) -> str:
    """One metric line per rank at ``step`` (the reference pipeline's JSON lines)."""
    return "".join(
        json.dumps({"step": step, "role": "drafter", "rank": r, "tokens_per_s": 100.0}) + "\n"
        for r in range(ranks)
    )


def job(
    root: Path, host: str, n: int, *, interval: float = 10.0, exec_prefix: list[str] | None = None
) -> JobConfig:
    """Job ``n`` on ``host``: a sleeper matched by ``^sleep 91NNN$`` in its own workdir, with a metric log."""
    workdir = root / f"job{n}"
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "train.log").write_text(metric_lines(1))
    return JobConfig(
        host=host,
        workdir=str(workdir),
        launch=["sleep"],
        log=str(workdir / "train.log"),
        match=f"^sleep {TOKEN + n}$",
        exec=exec_prefix or [],
        watch=WatchSettings(interval=interval, stall_after=3600, degraded_after=3600),
    )


@contextlib.contextmanager
def sleepers(config: Config) -> Iterator[None]:
    """Each job's process, started in its workdir (how a job without a recorded session is found)."""
    procs = [
        subprocess.Popen(
            ["sleep", spec.match.strip("^$").split()[1]], cwd=spec.workdir, start_new_session=True
        )
        for spec in config.jobs.values()
    ]
    try:
        for proc in procs:
            exec_done(proc)
        yield
    finally:
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def exec_done(proc: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    """Wait (bounded) until the child's /proc command line is its program's: Popen may return
    a moment before /proc shows the exec."""
    want = " ".join(str(a) for a in proc.args).encode()  # type: ignore[union-attr]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), open(f"/proc/{proc.pid}/cmdline", "rb") as f:
            if f.read().replace(b"\0", b" ").strip() == want:
                return
        time.sleep(0.01)
    raise AssertionError(f"pid {proc.pid} did not exec {want!r} within {timeout} s")


@pytest.fixture
async def two_hosts(tmp_path: Path) -> AsyncIterator[tuple[InProcessHost, InProcessHost]]:
    """Two in-process SSH hosts, each counting the commands it runs."""
    a = await start_in_process(tmp_path / "host-a")
    b = await start_in_process(tmp_path / "host-b")
    try:
        yield a, b
    finally:
        await a.host.close()
        await b.host.close()


@contextlib.asynccontextmanager
async def context(config: Config) -> AsyncIterator[Context]:
    """The process context for ``config`` (closed after)."""
    ctx = await build_context(config, MemoryOutbox(), instance="A")
    try:
        yield ctx
    finally:
        await close_context(ctx)


async def test_a_cycle_makes_one_helper_call_per_host_whatever_its_jobs(
    tmp_path: Path, redis_config: Config, two_hosts: tuple[InProcessHost, InProcessHost]
) -> None:
    """1 job on one host, 12 on the other: every cycle is one command on each host, and the
    per-rank progress of every job still advances with the lines its metric log gains."""
    small, big = two_hosts
    jobs = {"solo": job(tmp_path, "small", 0)} | {f"j{n}": job(tmp_path, "big", n) for n in range(1, 13)}
    config = redis_config.model_copy(
        update={
            "hosts": {
                "small": small.host_config(connect_timeout=5),
                "big": big.host_config(connect_timeout=5),
            },
            "jobs": jobs,
        }
    )
    with sleepers(config):
        async with context(config) as ctx:
            watcher = Watcher(ctx)
            store = ctx.redis.open_store(IncidentStore)
            for step in (2, 3, 4):
                for spec in jobs.values():
                    with open(spec.log, "a") as f:
                        f.write(metric_lines(step))
                before = (small.host.commands, big.host.commands)
                found = await asyncio.gather(watcher.cycle("small"), watcher.cycle("big"))
                assert (small.host.commands - before[0], big.host.commands - before[1]) == (1, 1)
                decisions = found[0] | found[1]
                assert sorted(decisions) == sorted(jobs)
                assert {d.condition for d in decisions.values()} == {"ok"}, decisions
                for name in jobs:
                    state = ProgressState.model_validate_json((await store.progress([name]))[name] or "{}")
                    assert {r: s.step for r, s in state.ranks.items()} == {"0": step, "1": step}, name


async def test_a_slow_host_does_not_delay_the_others_and_is_reported(
    tmp_path: Path,
    redis_config: Config,
    two_hosts: tuple[InProcessHost, InProcessHost],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A host whose probe is held (its exec wrapper waits on a FIFO) leaves the other host's cycle
    to finish on its own; once it answers, slower than its interval, it is logged and named in
    ``status`` as ``probe slow: slow took N s``."""
    fast, slow = two_hosts
    gate = tmp_path / "gate"
    os.mkfifo(gate)
    wait = ["/bin/sh", "-c", f'read x < {gate}; exec "$0" "$@"']
    interval = 0.5
    jobs = {
        "quick": job(tmp_path, "fast", 0, interval=60.0),  # never slow, however loaded the machine
        "late": job(tmp_path, "slow", 1, interval=interval, exec_prefix=wait),
    }
    config = redis_config.model_copy(
        update={
            "hosts": {
                "fast": fast.host_config(connect_timeout=5),
                "slow": slow.host_config(connect_timeout=5),
            },
            "jobs": jobs,
        }
    )
    caplog.set_level(logging.WARNING, logger="handlers.watch.cycle")
    with sleepers(config):
        async with context(config) as ctx:
            watcher = Watcher(ctx)
            began = time.monotonic()
            held = asyncio.ensure_future(watcher.cycle("slow"))
            quick = await asyncio.wait_for(watcher.cycle("fast"), 60)
            assert quick["quick"].condition == "ok"
            assert not held.done()  # its probe cannot answer before the gate opens
            assert not [r for r in caplog.records if "probe slow: fast" in r.getMessage()]
            await asyncio.sleep(max(0.0, interval + 0.2 - (time.monotonic() - began)))  # let it be late
            await asyncio.to_thread(_open_gate, gate)
            late = await asyncio.wait_for(held, 60)
            assert late["late"].condition == "ok"
            assert late["late"].state.probe_s is not None and late["late"].state.probe_s > interval
            assert [
                r.getMessage() for r in caplog.records if r.getMessage().startswith("probe slow: slow took ")
            ]
            gate.unlink()
            gate.write_text("open\n")  # from now on the wrapper reads at once
            reply = await status_command(ctx, None)
            slow_lines = [ln for ln in reply.lines if ln.startswith("probe slow: ")]
            assert len(slow_lines) == 1 and slow_lines[0].startswith("probe slow: slow took "), reply.lines
            assert slow_lines[0].endswith(f"(interval {interval:g} s)")


async def test_a_crash_is_told_with_its_evidence_from_the_cycles_one_helper_call(
    tmp_path: Path, redis_config: Config
) -> None:
    """A running job killed (SIGKILL): the cycle that finds it dead runs one probe on its host (and,
    the log naming no OOM kill, one read of the kernel's log), and the DEAD incident it opens
    carries the log's last lines, how the process ended (the launch waiter's record) and the crash
    class from the log since launch — all from that probe — and ``killed``, dmesg having no OOM kill."""
    async with open_harness(tmp_path, redis_config, {"train": {}}) as h:
        watcher = Watcher(h.ctx)
        run = await h.launch("train")
        assert run.verdict is Verdict.RUNNING, run.verdict_line
        assert (await watcher.cycle("local", ["train"]))["train"].condition == "ok"
        await h.kill("train")
        ended = Path(h.config.jobs["train"].log).with_name(".train.log.pitstop-exit")

        async def recorded() -> bool:  # the waiter writes the exit record once the process is reaped
            return ended.exists() and json.loads(ended.read_text() or "{}").get("pid") == run.pid

        assert await until(recorded, 20)
        assert isinstance(h.host, InProcessHost)
        before = h.host.host.commands
        decision = (await watcher.cycle("local", ["train"]))["train"]
        # the probe, and for a SIGKILL with no OOM line in the log the host's kernel log (dmesg)
        assert h.host.host.commands - before == 2
        assert decision.condition == "dead"
        incident = await h.ctx.redis.open_store(IncidentStore).incident("train")
        assert incident is not None and incident.kind.value == "dead"
        assert incident.exit_cause is not None and incident.exit_cause.startswith("killed by SIGKILL")
        assert incident.log is not None and '"step"' in incident.log.splitlines()[-1]
        assert incident.crash_class == "killed" and incident.crash_evidence


def _open_gate(gate: Path) -> None:
    with open(gate, "w") as f:
        f.write("go\n")


def test_the_probe_reads_a_jobs_bytes_only_while_it_runs(tmp_path: Path) -> None:
    """The helper's probe reads a job's metric-log range with its processes; ``if_running`` and
    none running: no read; a missing file: the read's error, the probe itself intact."""
    log = tmp_path / "m.log"
    log.write_bytes(b"0123456789")
    proc = subprocess.Popen(["sleep", "91999"], cwd=tmp_path, start_new_session=True)
    try:
        exec_done(proc)
        read: LogRead = {"path": str(log), "offset": 4, "max_bytes": 3, "inode": None, "if_running": True}
        base = {"workdir": str(tmp_path), "pid": None, "start_time": None, "sid": None, "log": str(log)}
        answer = op_probe(
            {
                "jobs": [
                    {"name": "up", "match": "^sleep 91999$", "read": read, **base},
                    {"name": "down", "match": "^sleep 91998$", "read": read, **base},
                    {
                        "name": "lost",
                        "match": "^sleep 91999$",
                        "read": {**read, "path": str(log) + ".no"},
                        **base,
                    },
                ]
            }
        )
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    up, down, lost = (answer["jobs"][n] for n in ("up", "down", "lost"))
    assert up["count"] == 1 and "read" in up and "error" not in up["read"]
    assert (up["read"]["offset"], up["read"]["size"], up["read"]["zlib"]) == (7, 10, True)
    assert down["count"] == 0 and "read" not in down
    assert lost["count"] == 1 and "No such file" in str(lost["read"]["error"])


def test_the_probe_brings_the_ending_of_a_job_short_of_processes_only(tmp_path: Path) -> None:
    """Asked for ``tail_lines``, the probe brings the log's last lines of a job with fewer than its
    ``processes`` (none: dead; one of two: short), and nothing more of a job with all of them."""
    log = tmp_path / "train.log"
    log.write_text("".join(f"line {i}\n" for i in range(50)))
    proc = subprocess.Popen(["sleep", "91997"], cwd=tmp_path, start_new_session=True)
    try:
        exec_done(proc)
        base = {"workdir": str(tmp_path), "pid": None, "start_time": None, "sid": None, "log": str(log)}
        ask = {"tail_lines": 3, "crash_from": 0, "crash_bytes": 1 << 20, **base}
        answer = op_probe(
            {
                "jobs": [
                    {"name": "up", "match": "^sleep 91997$", "processes": 1, **ask},
                    {"name": "short", "match": "^sleep 91997$", "processes": 2, **ask},
                    {"name": "dead", "match": "^sleep 91996$", "processes": 1, **ask},
                ]
            }
        )
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    up, short, dead = (answer["jobs"][n] for n in ("up", "short", "dead"))
    assert up["count"] == 1 and "tail" not in up and "status" not in up
    assert short["count"] == 1 and short["tail"] == "line 47\nline 48\nline 49"
    assert dead["count"] == 0 and dead["tail"] == short["tail"] and dead["status"] is None
    assert "crash" not in dead  # no recorded pid, no exit record: nothing to classify


@pytest.mark.parametrize("ago", [1.0, 3600.0])
def test_a_recent_death_brings_its_log_since_launch(tmp_path: Path, ago: float) -> None:
    """A dead job whose waiter recorded its end ``crash_within`` s ago or less comes back with its
    log since ``crash_from`` (what the crash check classifies); an older death only with its tail."""
    log = tmp_path / "train.log"
    log.write_bytes(b"before launch\n" + b"step 1\nRuntimeError: boom\n")
    gone = 2**22 + 4321  # no such process
    record = {"pid": gone, "start_time": None, "started_at": 0.0, "ended_at": time.time() - ago}
    (tmp_path / ".train.log.pitstop-exit").write_text(json.dumps({**record, "code": 1, "signal": None}))
    ask = {"tail_lines": 2, "processes": 1, "crash_from": 14, "crash_bytes": 1 << 20, "crash_within": 60.0}
    job = {"name": "j", "match": "^never$", "workdir": str(tmp_path), "log": str(log), **ask}
    answer = op_probe({"jobs": [{**job, "pid": gone, "start_time": None, "sid": None}]})["jobs"]["j"]
    assert answer["state"] == "gone" and answer["status"] is not None and answer["status"]["code"] == 1
    assert answer["tail"] == "step 1\nRuntimeError: boom"
    if ago < 60:
        crash = answer["crash"]
        assert "error" not in crash
        assert zlib.decompress(base64.b64decode(crash["data"])) == b"step 1\nRuntimeError: boom\n"
    else:
        assert "crash" not in answer


def test_a_death_in_a_log_truncated_since_launch_brings_the_logs_end(tmp_path: Path) -> None:
    """A log now shorter than its size at launch (rotated by copytruncate, say) and longer than
    ``crash_bytes`` comes back as its last ``crash_bytes`` (where the traceback is), not its first."""
    log = tmp_path / "train.log"
    log.write_bytes(b"".join(b"step %d\n" % i for i in range(40)) + b"RuntimeError: boom\n")
    gone = 2**22 + 4322  # no such process
    record = {"pid": gone, "start_time": None, "started_at": 0.0, "ended_at": time.time(), "code": 1}
    (tmp_path / ".train.log.pitstop-exit").write_text(json.dumps({**record, "signal": None}))
    ask = {"tail_lines": 2, "processes": 1, "crash_from": 10**6, "crash_bytes": 35, "crash_within": 60.0}
    job = {"name": "j", "match": "^never$", "workdir": str(tmp_path), "log": str(log), **ask}
    answer = op_probe({"jobs": [{**job, "pid": gone, "start_time": None, "sid": None}]})["jobs"]["j"]
    crash = answer["crash"]
    assert "error" not in crash
    assert zlib.decompress(base64.b64decode(crash["data"])) == b"step 38\nstep 39\nRuntimeError: boom\n"


def test_each_operation_ships_only_what_it_runs() -> None:
    """The probe's source (sent and compiled on every call) is a fraction of the whole helper,
    with its marker line, and holds none of the other operations."""
    whole, probe = helper_source(), helper_source("probe")
    assert probe.splitlines()[0] == whole.splitlines()[0]  # the marker the helper excludes itself by
    assert len(probe) * 4 < len(whole)
    assert "def op_probe" in probe and "def op_launch" not in probe and "pitstop-waiter" in probe
    assert "'probe': op_probe" in probe and "'launch'" not in probe


def helper_command_lines(env_mark: Path) -> list[list[bytes]]:
    """The argv of every running copy of the host helper (its marker in the command line) whose
    environment holds ``env_mark`` (a test's hosts put their own directory in it)."""
    found = []
    for pid in [e for e in os.listdir("/proc") if e.isdigit()]:
        with contextlib.suppress(OSError):
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            mine = str(env_mark).encode() in Path(f"/proc/{pid}/environ").read_bytes()
            if mine and any(MARKER.encode() in a for a in argv):
                found.append(argv)
    return found


def release(fifo: Path) -> bool:
    """Open ``fifo`` for writing and close it, if a reader holds it open (its read then ends)."""
    try:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:  # ENXIO: no reader yet
        return False
    return True


async def test_a_probe_of_500_jobs_keeps_every_argument_off_the_command_line(
    tmp_path: Path, any_ssh_host: HostUnderTest
) -> None:
    """500 running jobs on one host, whose arguments are past the kernel's 128 KiB a string: one
    probe counts each, and while the helper runs (held on a FIFO it reads) no command line on the
    host holds any of them — its argv is the program and the operation's name, nothing more."""
    jobs = {f"j{n}": job(tmp_path, "local", n) for n in range(500)}
    config = Config(hosts={"local": any_ssh_host.host_config(connect_timeout=10)}, jobs=jobs)
    fifo = tmp_path / "held.fifo"
    os.mkfifo(fifo)
    read: LogRead = {"path": str(fifo), "offset": 0, "max_bytes": 10, "inode": None, "if_running": True}
    entries = [(name, spec, None) for name, spec in jobs.items()]
    args = {"jobs": [probe_args(name, spec, None) for name, spec, _ in entries]}
    assert len(helper_input(args)) > 128 * 1024  # once refused by execve (E2BIG) as one argument
    want = [a.encode() for a in helper_argv("probe")[1:]] + [b""]  # its argv after argv[0]
    pool = SSHPool(config)
    try:
        with sleepers(config):
            probing = asyncio.create_task(probe_host(pool, "local", entries, {"j0": read}))
            try:
                seen: list[list[bytes]] = []

                async def helper_runs() -> bool:  # the helper itself, past any python3 shim
                    seen[:] = await asyncio.to_thread(helper_command_lines, tmp_path)
                    return want in [argv[1:] for argv in seen]

                assert await until(helper_runs, 30)
            finally:
                assert await until(lambda: asyncio.to_thread(release, fifo), 30)
            found = await asyncio.wait_for(probing, 60)
    finally:
        await pool.close()
    words = [str(tmp_path).encode(), b"91000", b"j499", b'"jobs"']
    assert all(w not in a for argv in seen for a in argv for w in words), seen
    assert sorted(found) == sorted(jobs)
    assert {p.error for p in found.values()} == {None}
    assert {p.count for p in found.values()} == {1}
