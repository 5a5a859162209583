"""Crash classes: classification of all ranks' log bytes, the auto_restart policy on classes, and
(end to end, real processes printing the reference pipeline's failures) retry vs give up."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from bot.runtime.scheduler import PitstopScheduler
from handlers.watch.evidence import CrashCheck, check_crash, elsewhere, refusal
from pipeline.config import AutoRestart, Config, parse_config
from pipeline.config.jobs import DEFAULT_EXIT_CODES, TRANSIENT, CrashClass, ExitPolicy
from pipeline.errors import ConfigError
from pipeline.host.helper import OOM_RX
from pipeline.observe.attempts import crash_words
from pipeline.observe.crashes import Crash, classify, detect_cause, from_fields
from pipeline.state.events import EventKind
from pipeline.verdict import Verdict
from tests.fixtures.ssh import start_in_process
from tests.test_scheduler import _events
from tests.test_watch import MENTION, open_harness, until

DFLASH = Path(__file__).resolve().parents[1] / "pipeline" / "dflash"
FIXTURES = Path(__file__).resolve().parent / "fixtures"


def metric(rank: int, step: int) -> str:
    """A reference-pipeline metric line."""
    return f'{{"step":{step},"role":"drafter","rank":{rank},"tokens_per_s":1.0}}'


def test_each_class_from_what_the_failure_prints() -> None:
    """Xid, host OOM (SIGKILL), other signals, NCCL errors and unknown exits get their class and evidence."""
    xid = classify(b"step 1\nNVRM: Xid (PCI:0000:3b:00): 79, pid=4242, GPU has fallen off the bus.\n")
    assert xid.kind is CrashClass.XID and xid.evidence is not None and "Xid" in xid.evidence
    wait = '{"event":"waiting","rank":6,"role":"drafter","step":41,"on":"queue"}'  # an event, not a step
    killed = f"{metric(6, 40)}\n{wait}\ndflash-main: drafter rank 6 (pid 77) exited with code -9; stopping the job\n"
    sigkill = classify(killed.encode())
    assert (sigkill.kind, sigkill.rank, sigkill.step) == (CrashClass.KILLED, 6, 40)
    assert classify(b"x\n", exit_signal="SIGKILL").kind is CrashClass.KILLED
    segv = classify(b"dflash-main: target rank 2 (pid 9) exited with code -11; stopping the job\n")
    assert (segv.kind, segv.rank) == (CrashClass.SIGNAL, 2)
    nccl = classify(b"RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error\n")
    assert nccl.kind is CrashClass.NCCL_ERROR
    unknown = classify(b"step 1\nstep 2\n", exit_code=3)
    assert (
        unknown.kind is CrashClass.UNKNOWN and unknown.evidence == "exit code 3, no failure line in the log"
    )


def test_cublas_allocation_failure_and_the_oom_reaper_are_out_of_memory() -> None:
    """cuBLAS failing to allocate is a CUDA OOM, and the kernel's ``oom_reaper`` line a host OOM, in
    the classification and in the cause a log tail gives (each pattern was once defined twice, the
    second without them)."""
    cublas = b"RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`\n"
    assert classify(cublas).kind is CrashClass.CUDA_OOM
    assert detect_cause(cublas.decode()) == f"CUDA out of memory: {cublas.decode().strip()}"
    reaper = "step 3\noom_reaper: reaped process 4242 (python3), now anon-rss:0kB\n"
    assert classify(reaper.encode()).kind is CrashClass.HOST_OOM
    assert detect_cause(reaper) == "killed by the kernel's OOM killer: " + reaper.splitlines()[1]


#: a real kernel's OOM report (6.18, a memory cgroup's limit), recorded with ``dmesg``: it killed pid 29343
RECORDED_DMESG = (FIXTURES / "kernel" / "dmesg_oom_memcg.txt").read_text()
RECORDED_PID = 29343


def kernel_oom_lines(text: str) -> list[str]:
    """The lines of a dmesg output the helper's ``kernel_oom`` keeps (its own filter)."""
    return [ln.strip() for ln in text.splitlines() if OOM_RX.search(ln)]


def test_a_sigkill_is_killed_unless_the_kernel_logged_an_oom_kill_of_that_pid() -> None:
    """A bare SIGKILL is ``killed`` with the signal as evidence; only the kernel's own OOM line for one
    of the killed pids (in the log, or in the host's dmesg) makes it ``host_oom``."""

    def launcher(pid: int) -> bytes:
        return f"{metric(6, 40)}\ndflash-main: drafter rank 6 (pid {pid}) exited with code -9; stopping\n".encode()

    kernel = kernel_oom_lines(RECORDED_DMESG)
    assert len(kernel) == 3  # invoked oom-killer, oom-kill:, Memory cgroup out of memory: Killed process
    oom = classify(launcher(RECORDED_PID), kernel=kernel)
    assert (oom.kind, oom.rank, oom.step) == (CrashClass.HOST_OOM, 6, 40)
    assert oom.evidence is not None
    assert oom.evidence.startswith(
        "[27841.141530] Memory cgroup out of memory: Killed process 29343 (python3)"
    )
    other = classify(launcher(77), kernel=kernel)  # the kernel killed someone else
    assert other.kind is CrashClass.KILLED
    assert other.evidence == (
        "dflash-main: drafter rank 6 (pid 77) exited with code -9; stopping: killed by SIGKILL, and the "
        "host's dmesg has no OOM kill of pid 77"
    )
    leader = classify(b"step 3\n", exit_signal="SIGKILL", pids=[RECORDED_PID], kernel=kernel)
    assert leader.kind is CrashClass.HOST_OOM  # the recorded pid itself was the one killed
    denied = "dmesg: read kernel buffer failed: Operation not permitted"
    blind = classify(b"step 3\n", exit_signal="SIGKILL", pids=[5], kernel_unreadable=denied)
    assert (blind.kind, blind.evidence) == (
        CrashClass.KILLED,
        f"killed by SIGKILL, and the host's dmesg could not be read ({denied}), so "
        "it shows no OOM kill of pid 5",
    )
    shell = classify(b"step 3\n./run.sh: line 7:  4242 Killed    python3 train.py\n")
    assert shell.kind is CrashClass.KILLED and shell.evidence and "no OOM kill of pid 4242" in shell.evidence
    assert CrashClass.KILLED in TRANSIENT and CrashClass.KILLED in AutoRestart().on


def test_the_earliest_failure_of_any_rank_wins_over_the_collateral() -> None:
    """Rank 6's exception comes first; the others' later NCCL timeouts and 'launcher is gone' are collateral."""
    text = "\n".join(
        [
            metric(5, 10),
            metric(6, 10),
            "dflash-worker drafter rank 6 failed:",
            "Traceback (most recent call last):",
            '  File "train.py", line 1, in <module>',
            "ValueError: loss is nan",
            "[rank0]:[E ProcessGroupNCCL.cpp:632] [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(",
            "dflash-worker drafter rank 5 failed:",
            "Traceback (most recent call last):",
            "RuntimeError: launcher is gone",
        ]
    )
    found = classify(text.encode())
    assert found.kind is CrashClass.PYTHON_EXCEPTION
    assert (found.exc_type, found.message, found.rank, found.step) == ("ValueError", "loss is nan", 6, 10)
    assert found.summary == "python_exception: ValueError: loss is nan"
    assert from_fields(found.to_fields()) == found


def test_auto_restart_policy_on_classes_and_repeats() -> None:
    """Default ``on`` = the transient classes; a repeating Python exception is never retried."""
    policy = AutoRestart()
    assert policy.on == list(TRANSIENT)
    nccl = CrashCheck(Crash(CrashClass.NCCL_TIMEOUT, "Watchdog caught …"), False, None)
    assert refusal("dflash", nccl, policy) is None
    exc = Crash(CrashClass.PYTHON_EXCEPTION, "ValueError: x", "ValueError", "x", 6, 40)
    why = refusal("dflash", CrashCheck(exc, False, None), policy)
    assert why is not None and "python_exception is not in auto_restart.on" in why
    allow_all = AutoRestart(on=list(CrashClass))
    assert refusal("dflash", CrashCheck(exc, False, None), allow_all) is None
    why = refusal("dflash", CrashCheck(exc, True, None), allow_all)
    assert why is not None and why.startswith("dflash failed again with ValueError at step 40")
    assert refusal("dflash", nccl, None) is None
    assert exc.same_failure(Crash(CrashClass.PYTHON_EXCEPTION, "ValueError: y", "ValueError", "y", 6, 40))
    assert not exc.same_failure(Crash(CrashClass.PYTHON_EXCEPTION, "ValueError: y", "ValueError", "y", 6, 41))


def test_unknown_class_in_on_is_a_config_error() -> None:
    """``on = ["nccl_timout"]`` is refused with its TOML path."""
    job = {"host": "h", "workdir": "/w", "launch": ["x"], "log": "/w/l", "match": "m"}
    job["watch"] = {"auto_restart": {"on": ["nccl_timout"]}}  # type: ignore[assignment]
    with pytest.raises(ConfigError) as err:
        parse_config({"hosts": {"h": {"address": "a"}}, "jobs": {"j": job}})
    assert "jobs.j.watch.auto_restart.on[0]" in str(err.value.problems)


def test_preemptions_and_time_limits_are_their_own_kind_and_never_refused() -> None:
    """Slurm's PREEMPTED and TIMEOUT decide the class before any log line (a preempted job's log
    may say ``Killed``); they are restarted whatever ``on`` says, and their words name them."""
    log = f"{metric(0, 12)}\nKilled\n".encode()
    preempted = classify(log, exit_code=0, end_state="PREEMPTED")
    assert (preempted.kind, preempted.step, preempted.exit_code) == (CrashClass.PREEMPTED, 12, 0)
    assert preempted.evidence == "Slurm ended the job PREEMPTED"
    timeout = classify(log, end_state="TIMEOUT")
    assert timeout.kind is CrashClass.TIME_LIMIT
    assert classify(log, end_state="FAILED").kind is CrashClass.KILLED  # any other state: the log decides
    only_oom = AutoRestart(on=[CrashClass.CUDA_OOM])
    for crash in (preempted, timeout):
        assert refusal("dflash", CrashCheck(crash, False, None), only_oom, DEFAULT_EXIT_CODES) is None
    assert (crash_words(preempted), crash_words(timeout)) == ("preempted (exit code 0)", "time limit")
    assert from_fields(preempted.to_fields()) == preempted


def test_exit_code_policy() -> None:
    """93 and 17 stop automatic restarts and say why; 16 restarts excluding the failing rank's node,
    whatever ``on`` says; a code not in the table leaves the class to decide."""
    policy = AutoRestart(on=[CrashClass.NCCL_TIMEOUT])
    gave_up = Crash(CrashClass.UNKNOWN, "exit code 93, no failure line in the log", exit_code=93)
    why = refusal("dflash", CrashCheck(gave_up, False, None, "n2"), policy, DEFAULT_EXIT_CODES)
    assert why is not None and why.startswith(
        "dflash exited with code 93 (nvidia-resiliency-ext gave up: no progress), which exit_codes maps "
        "to no_restart - no automatic restarts"
    )
    check = CrashCheck(Crash(CrashClass.NCCL_TIMEOUT, "Watchdog …", exit_code=17), False, None, "n1")
    why = refusal("dflash", check, policy, DEFAULT_EXIT_CODES)
    assert why is not None and "a validation failed" in why
    assert elsewhere(check, DEFAULT_EXIT_CODES) == ()  # no_restart: nothing to leave out
    rerun = CrashCheck(Crash(CrashClass.PYTHON_EXCEPTION, "x", rank=5, exit_code=16), False, None, "n2")
    assert refusal("dflash", rerun, policy, DEFAULT_EXIT_CODES) is None
    assert elsewhere(rerun, DEFAULT_EXIT_CODES) == ("n2",)
    assert elsewhere(replace(rerun, node=None), DEFAULT_EXIT_CODES) == ()  # the node is unknown
    # the job's own table replaces the default: 93 is then only an exit code
    mine = {42: ExitPolicy.NO_RESTART}
    assert refusal("dflash", CrashCheck(gave_up, False, None), AutoRestart(), mine) is None
    assert "exited with code 42, which" in (
        refusal("dflash", CrashCheck(replace(gave_up, exit_code=42), False, None), AutoRestart(), mine) or ""
    )
    assert refusal("dflash", CrashCheck(gave_up, False, None), None, mine) is None  # no auto_restart at all


def test_exit_codes_in_the_config() -> None:
    """``exit_codes`` defaults to the three; a table of the job's own replaces it; a policy or a code
    Pitstop does not know is refused with its TOML path."""
    job = {"host": "h", "workdir": "/w", "launch": ["x"], "log": "/w/l", "match": "m"}
    config = parse_config({"hosts": {"h": {"address": "a"}}, "jobs": {"j": job}})
    assert config.jobs["j"].exit_codes == DEFAULT_EXIT_CODES
    mine = {**job, "exit_codes": {"42": "restart_elsewhere"}}
    config = parse_config({"hosts": {"h": {"address": "a"}}, "jobs": {"j": mine}})
    assert config.jobs["j"].exit_codes == {42: ExitPolicy.RESTART_ELSEWHERE}
    for bad in ({"42": "no_restrat"}, {"300": "no_restart"}):
        with pytest.raises(ConfigError) as err:
            parse_config({"hosts": {"h": {"address": "a"}}, "jobs": {"j": {**job, "exit_codes": bad}}})
        assert any("jobs.j.exit_codes" in p for p in err.value.problems), err.value.problems


# --- end to end: processes that fail as the reference pipeline does --------------------------------

CRASHER = f"""\
import json, os, sys, time, traceback
sys.path.insert(0, {str(DFLASH)!r})
import faults
here = os.path.dirname(os.path.abspath(__file__))
mode = json.load(open(os.path.join(here, "mode.json")))

class Log:
    def line(self, text): print(text, flush=True)
    def metric(self, rec): print(json.dumps(rec), flush=True)
    def same_file_as(self, fd): return True

step = 0
while True:
    step += 1
    if step <= 2:  # the last metric line is always step 2: a crash later is "at step 2"
        print(json.dumps({{"step": step, "role": "drafter", "rank": 6, "tokens_per_s": 1.0}}), flush=True)
    elif os.path.exists(os.path.join(here, "crash.now")):
        spec = {{"rank": 6, "role": "drafter", "role_rank": 1, "device": "cpu",
                "faults": {{"crash": [6, step, mode["crash"]]}}}}
        try:
            faults.crash_if_due(spec, Log(), step)
        except Exception:
            print("dflash-worker drafter rank 6 failed:\\n" + traceback.format_exc(), flush=True)
            os._exit(1)
    time.sleep(0.1)
"""


@pytest.mark.parametrize("kind", ["nccl_timeout", "exception"])
async def test_auto_restart_retries_nccl_timeout_and_gives_up_on_a_repeating_exception(
    tmp_path: Path, redis_config: Config, kind: str
) -> None:
    """nccl_timeout (transient) is restarted automatically, with its class in the alert; the same
    exception at the same step after a restart ends automatic restarts with one give-up post saying why."""
    on = list(TRANSIENT) + ([CrashClass.PYTHON_EXCEPTION] if kind == "exception" else [])
    policy = AutoRestart(max=3, within=600, backoff=0.2, on=on)
    async with open_harness(
        tmp_path, redis_config, {"job": {"start_window": 1.0, "auto_restart": policy}}
    ) as h:
        (h.root / "job" / "worker.py").write_text(CRASHER)
        ctx = h.ctx
        sched = PitstopScheduler(ctx, leader_ttl=2.0, poll_interval=0.2)
        await sched.start()
        try:
            after = await ctx.events.last_id()
            h.set_mode("job", crash=kind)
            # verified RUNNING by the scheduler (the verification's one claimant): the job is expected to be up
            run = await h.launch("job", verify=False)
            assert await _events(h, EventKind.VERDICT, "job", after, count=1, timeout=30)
            run = await ctx.runs.get(run.id)
            assert run.verdict is Verdict.RUNNING, run.evidence
            (h.root / "job" / "crash.now").write_text("")  # from now on every run fails after step 2
            [alert] = await _events(h, EventKind.ALERT, "job", after, count=1, timeout=20)
            expected_class = "nccl_timeout" if kind == "nccl_timeout" else "python_exception"
            assert alert.data["alert"] == "dead" and alert.data["cause"].startswith(expected_class)
            if kind == "nccl_timeout":
                assert "Watchdog caught collective operation timeout" in alert.data["cause"]
                restarts = await _events(h, EventKind.RESTART, "job", after, count=1, timeout=20)
                assert restarts and restarts[0].data["auto"] and restarts[0].data["attempt"] == 1
                return
            [restart] = await _events(h, EventKind.RESTART, "job", after, count=1, timeout=20)
            gave_up = await _events(h, EventKind.ALERT, "job", alert.id, count=1, timeout=20)
            assert len(gave_up) == 1
            assert await _events(h, EventKind.RESTART, "job", restart.id, count=1, timeout=2.0) == []
            posts = h.thread(f"{MENTION} job failed again with RuntimeError at step 2")
            assert len(posts) == 1, [p.reply.title for p in ctx.outbox.of("thread")]  # type: ignore[attr-defined]
            assert "python_exception: RuntimeError: injected exception at step" in posts[0].reply.title
            assert len(h.alerts()) == 1
        finally:
            await sched.stop()


async def test_crash_check_reads_the_hosts_dmesg_to_tell_an_oom_kill_from_a_kill(
    tmp_path: Path, redis_config: Config
) -> None:
    """Over SSH, a job killed by SIGKILL is ``killed`` while the host's dmesg (the stand-in replaying
    a recorded real OOM report) names another pid, ``host_oom`` once it names the job's, and
    ``killed`` saying why when dmesg cannot be read."""
    host = await start_in_process(tmp_path / "ssh")
    assert host.kernel_dir is not None
    kernel = host.kernel_dir
    try:
        async with open_harness(tmp_path, redis_config, {"job": {}}, host=host) as h:
            status = h.root / "job" / ".train.log.pitstop-exit"

            async def crash_of(job_pid: int) -> Crash:
                await h.kill("job")

                async def recorded() -> bool:  # the waiter's exit record of this run
                    return status.exists() and json.loads(status.read_text() or "{}").get("pid") == job_pid

                assert await until(recorded, timeout=20)
                check = await check_crash(h.ctx, "job")
                assert check is not None and (check.exit_cause or "").startswith("killed by SIGKILL")
                return check.crash

            (kernel / "dmesg.txt").write_text(RECORDED_DMESG)  # the kernel killed pid 29343, not ours
            run = await h.launch("job")
            assert run.pid is not None and run.pid != RECORDED_PID
            killed = await crash_of(run.pid)
            assert killed.kind is CrashClass.KILLED and killed.evidence is not None
            assert f"the host's dmesg has no OOM kill of pid {run.pid}" in killed.evidence

            run = await h.launch("job")
            assert run.pid is not None
            (kernel / "dmesg.txt").write_text(RECORDED_DMESG.replace(str(RECORDED_PID), str(run.pid)))
            oom = await crash_of(run.pid)
            assert oom.kind is CrashClass.HOST_OOM and oom.evidence is not None
            assert f"Memory cgroup out of memory: Killed process {run.pid} (python3)" in oom.evidence

            (kernel / "denied").write_text("")  # kernel.dmesg_restrict=1
            run = await h.launch("job")
            assert run.pid is not None
            blind = await crash_of(run.pid)
            assert blind.kind is CrashClass.KILLED and blind.evidence is not None
            assert "dmesg could not be read (dmesg: read kernel buffer failed: Operation not permitted)" in (
                blind.evidence
            )
    finally:
        await host.host.close()
