"""Failures on purpose, for tests and the demo: a hung rank, a crash of a named kind, wait reports.

``--hang-rank R --hang-at-step S``: after finishing its step S, rank R stops advancing and blocks
(as a rank stuck in a collective does): it never enters the next step-boundary all-reduce, so the
other drafters wait on it there, and the targets' queue fills and they wait to put.  It leaves only
when the launcher is gone (SIGKILL of the job's process group ends it).

``--crash-rank R --crash-at-step S --crash KIND``: during its step S, rank R fails the way the real
failure does, printing what the real failure prints:

- ``nccl_timeout``: the ProcessGroupNCCL watchdog's lines, then ``terminate called after throwing
  an instance of 'c10::DistBackendError'`` and SIGABRT (exit code -6 in the launcher's line);
- ``cuda_oom``: ``torch.OutOfMemoryError: CUDA out of memory. Tried to allocate …`` (traceback, exit 1);
- ``exception``: ``RuntimeError: injected exception at step S (ROLE rank R)`` (traceback, exit 1).

``--slow-after-step S --slow-factor F [--slow-rank R]``: after its step S, rank R (every rank when
``--slow-rank`` is not given) takes F times as long per step (it sleeps F-1 times the step's own
time after each step): a bad patch or a degraded GPU, as throughput shows it while every process
is alive.  One slow drafter slows them all (they all-reduce at every step boundary).

``--nan-at-step S``: from its step S on, every drafter reports its loss as NaN (JSON ``NaN``), as a
run whose weights went NaN does; the training itself goes on unchanged (only the reported value).

``--loss-spike-at-step S [--loss-spike-factor F] [--loss-spike-for N]``: from step S, every drafter
reports its loss F times as high (default 10), for N steps (default: for good), then its true loss
again: a loss spike, and with ``--loss-spike-for`` its recovery.

``--step-time S``: every drafter holds each of its training steps to S seconds (it sleeps out what
the step left of them; a step that took longer is not made up for): a steady pace on a CPU shared
with other work, so the drafters' rate and the ETA a digest shows are known in advance (1/S steps/s,
plus the step-boundary all-reduce).  Targets are not held: they fill the bounded queue and wait.

Wait reports: a rank blocked for more than :data:`WAIT_REPORT_S` seconds (in the step-boundary
all-reduce, or putting into a full queue) appends one JSON line ``{"ts", "event": "waiting",
"rank", "role", "step", "on", "waited_s"}``, then one every :data:`WAIT_REPEAT_S` seconds while
it still waits.  The ``event`` key makes it an event, not a metric record; a watcher reads it as
"rank 5 is alive, waiting at step 40 on all_reduce".

Standard library at the top level only (workers import this before torch).
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

CRASH_KINDS = ("nccl_timeout", "cuda_oom", "exception")
WAIT_REPORT_S = 2.0  #: seconds blocked before a rank reports that it waits
WAIT_REPEAT_S = 15.0  #: seconds between further reports while it still waits


def add_arguments(p: Any) -> None:
    """Add the fault-injection options to an ``argparse.ArgumentParser``."""
    p.add_argument("--hang-rank", type=int, default=None, help="global rank that hangs (with --hang-at-step)")
    p.add_argument(
        "--hang-at-step", default=None, help="the step after which it hangs (+N: N after the resume)"
    )
    p.add_argument("--crash-rank", type=int, default=None, help="global rank that crashes (with --crash-*)")
    p.add_argument(
        "--crash-at-step", default=None, help="the step during which it crashes (+N: after the resume)"
    )
    p.add_argument("--crash", choices=CRASH_KINDS, default=None, help="how it crashes")
    p.add_argument("--slow-rank", type=int, default=None, help="global rank that slows (default: every rank)")
    p.add_argument(
        "--slow-after-step", default=None, help="the step after which it slows (+N: N after the resume)"
    )
    p.add_argument("--slow-factor", type=float, default=None, help="how many times longer each step takes")
    p.add_argument(
        "--step-time", type=float, default=None, help="seconds each drafter step is held to (a steady pace)"
    )
    p.add_argument("--nan-at-step", default=None, help="the step from which the loss reported is NaN (+N)")
    p.add_argument(
        "--loss-spike-at-step", default=None, help="the step from which the loss reported spikes (+N)"
    )
    p.add_argument("--loss-spike-factor", type=float, default=None, help="times the true loss (default 10)")
    p.add_argument(
        "--loss-spike-for", type=int, default=None, help="steps the spike lasts (default: for good)"
    )


def plan(args: Any, world: int, resume_step: int = 0) -> dict[str, Any]:
    """The faults asked for on the command line, checked: ``{"hang": (rank, step) | None, "crash": …}``,
    ``"slow": (rank | None, step, factor)`` when a slowdown is asked for, ``"pace": seconds``
    when a step time is, ``"nan": step`` and ``"spike": (step, factor, steps | None)`` when asked for.

    A step written ``+N`` counts from the step the run resumes at (``resume_step + N``).

    :param args: the parsed options.
    :param world: the number of workers (ranks are ``0 .. world-1``).
    :param resume_step: the checkpoint step this run resumes from (0: from scratch).
    :raises SystemExit: if an option comes without its partners or a rank/step is out of range.
    """
    out: dict[str, Any] = {"hang": None, "crash": None}
    hang = (args.hang_rank, args.hang_at_step)
    if any(v is not None for v in hang):
        if None in hang:
            raise SystemExit("--hang-rank and --hang-at-step go together")
        out["hang"] = _checked(hang[0], _step(hang[1], resume_step, "--hang"), world, "--hang")
    crash = (args.crash_rank, args.crash_at_step, args.crash)
    if any(v is not None for v in crash):
        if None in crash:
            raise SystemExit("--crash-rank, --crash-at-step and --crash go together")
        out["crash"] = (
            *_checked(crash[0], _step(crash[1], resume_step, "--crash"), world, "--crash"),
            crash[2],
        )
    slow = (getattr(args, "slow_after_step", None), getattr(args, "slow_factor", None))
    if any(v is not None for v in (*slow, getattr(args, "slow_rank", None))):
        if None in slow:
            raise SystemExit("--slow-after-step and --slow-factor go together (--slow-rank is optional)")
        if not slow[1] >= 1.0:
            raise SystemExit(f"--slow-factor {slow[1]}: 1 or more (2: each step takes twice as long)")
        rank = getattr(args, "slow_rank", None)
        if rank is not None and not 0 <= rank < world:
            raise SystemExit(f"--slow-rank {rank}: ranks are 0..{world - 1}")
        out["slow"] = (rank, _step(slow[0], resume_step, "--slow"), slow[1])
    pace = getattr(args, "step_time", None)
    if pace is not None:
        if not pace > 0:
            raise SystemExit(f"--step-time {pace}: seconds per step, more than 0")
        out["pace"] = pace
    if getattr(args, "nan_at_step", None) is not None:
        out["nan"] = _first_step(_step(args.nan_at_step, resume_step, "--nan"), "--nan")
    spike = (getattr(args, "loss_spike_factor", None), getattr(args, "loss_spike_for", None))
    if getattr(args, "loss_spike_at_step", None) is None:
        if any(v is not None for v in spike):
            raise SystemExit("--loss-spike-factor and --loss-spike-for go with --loss-spike-at-step")
    else:
        at = _first_step(_step(args.loss_spike_at_step, resume_step, "--loss-spike"), "--loss-spike")
        factor = 10.0 if spike[0] is None else spike[0]
        if not factor > 1.0:
            raise SystemExit(
                f"--loss-spike-factor {factor}: more than 1 (10: the loss reported 10 times as high)"
            )
        if spike[1] is not None and spike[1] < 1:
            raise SystemExit(f"--loss-spike-for {spike[1]}: steps, 1 or more")
        out["spike"] = (at, factor, spike[1])
    return out


def _step(text: str, resume_step: int, flag: str) -> int:
    try:
        return resume_step + int(text[1:]) if text.startswith("+") else int(text)
    except ValueError:
        raise SystemExit(
            f"{flag}-at-step {text!r}: a step number, or +N for N steps after the resume"
        ) from None


def _checked(rank: int, step: int, world: int, flag: str) -> tuple[int, int]:
    if not 0 <= rank < world:
        raise SystemExit(f"{flag}-rank {rank}: ranks are 0..{world - 1}")
    return rank, _first_step(step, flag)


def _first_step(step: int, flag: str) -> int:
    if step < 1:
        raise SystemExit(f"{flag}-at-step {step}: steps start at 1")
    return step


def reported_loss(spec: dict[str, Any], step: int, loss: float) -> float:
    """The loss a drafter reports for ``step``: NaN from ``--nan-at-step`` on, times
    ``--loss-spike-factor`` during a spike, else ``loss`` itself (see the module docstring)."""
    found = spec.get("faults", {})
    if found.get("nan") is not None and step >= found["nan"]:
        return float("nan")
    spike = found.get("spike")
    if spike and step >= spike[0] and (spike[2] is None or step < spike[0] + spike[2]):
        return round(loss * spike[1], 6)
    return loss


def crash_if_due(spec: dict[str, Any], log: Any, step: int) -> None:
    """Fail now if this rank's crash is due at ``step`` (see the module docstring)."""
    crash = spec.get("faults", {}).get("crash")
    if not crash or crash[0] != spec["rank"] or crash[1] != step:
        return
    kind, who = crash[2], f"{spec['role']} rank {spec['rank']}"
    if kind == "exception":
        raise RuntimeError(f"injected exception at step {step} ({who})")
    if kind == "cuda_oom":
        import torch  # lazy: train.py imports this module before torch (its docstring says why)

        oom = getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError
        gpu = spec["device"].split(":")[-1] if spec["device"].startswith("cuda") else spec["rank"]
        raise oom(
            f"CUDA out of memory. Tried to allocate 2.00 GiB. GPU {gpu} has a total capacity of 79.11 GiB "
            "of which 1.06 GiB is free. Including non-PyTorch memory, this process has 78.04 GiB memory in "
            "use. Of the allocated memory 75.31 GiB is allocated by PyTorch, and 1.27 GiB is reserved by "
            "PyTorch but unallocated. If reserved but unallocated memory is large try setting "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation."
        )
    r = spec.get("role_rank", spec["rank"])
    op = f"WorkNCCL(SeqNum={step * 3}, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000)"
    what = f"[Rank {r}] Watchdog caught collective operation timeout: {op} ran for 600011 milliseconds before timing out."
    text = (
        f"[rank{r}]:[E ProcessGroupNCCL.cpp:632] {what}\n"
        f"[rank{r}]:[E ProcessGroupNCCL.cpp:1664] [PG 0 (default_pg) Rank {r}] Exception (either an error or "
        "timeout) detected by watchdog at work: "
        f"{step * 3}, last enqueued NCCL work: {step * 3}, last completed NCCL work: {step * 3 - 1}.\n"
        f"[rank{r}]:[E ProcessGroupNCCL.cpp:1709] [PG 0 (default_pg) Rank {r}] Timeout at NCCL work: "
        f"{step * 3}, last enqueued NCCL work: {step * 3}, last completed NCCL work: {step * 3 - 1}.\n"
        f"[rank{r}]:[E ProcessGroupNCCL.cpp:621] [Rank {r}] Some NCCL operations have failed or timed out. "
        "Due to the asynchronous nature of CUDA kernels, subsequent GPU operations might run on corrupted/"
        "incomplete data.\n"
        f"[rank{r}]:[E ProcessGroupNCCL.cpp:627] [Rank {r}] To avoid data inconsistency, we are taking the "
        "entire process down.\n"
        "terminate called after throwing an instance of 'c10::DistBackendError'\n"
        f"  what():  [PG 0 (default_pg) Rank {r}] Process group watchdog thread terminated with exception: "
        f"{what}\n"
    )
    log.line(text)
    if not log.same_file_as(2):
        sys.stderr.write(text)
        sys.stderr.flush()
    os.abort()


def slow_if_due(spec: dict[str, Any], step: int, began: float) -> None:
    """Make this rank's step ``step`` take ``--slow-factor`` times as long, if it is slowed by now.

    :param began: ``time.monotonic()`` when the step began.
    """
    slow = spec.get("faults", {}).get("slow")
    if not slow or (slow[0] is not None and slow[0] != spec["rank"]) or step <= slow[1]:
        return
    time.sleep(max(0.0, (slow[2] - 1.0) * (time.monotonic() - began)))


def pace(spec: dict[str, Any], began: float) -> None:
    """Hold this drafter step to ``--step-time`` seconds (sleep out the rest), if one is asked for.

    :param began: ``time.monotonic()`` when the step began.
    """
    step_s = spec.get("faults", {}).get("pace")
    if step_s:
        time.sleep(max(0.0, began + step_s - time.monotonic()))


def hang_if_due(spec: dict[str, Any], step: int, orphaned: Any) -> None:
    """Block for good if this rank hangs after ``step``; returns only if the launcher is gone."""
    hang = spec.get("faults", {}).get("hang")
    if not hang or hang[0] != spec["rank"] or hang[1] != step:
        return
    while not orphaned():  # blocked, as in a collective: no step, no line, deaf to SIGTERM
        time.sleep(0.5)
    raise RuntimeError("launcher is gone")


class WaitReporter:
    """Writes a ``waiting`` line when a rank has been blocked for a while (module docstring).

    :param spec: the worker's spec (rank, role).
    :param log: the worker's :class:`train.Log`.
    :param on: what it waits on (``all_reduce``, ``queue``).
    """

    def __init__(self, spec: dict[str, Any], log: Any, on: str) -> None:
        self.spec, self.log, self.on = spec, log, on
        self.since = time.monotonic()
        self.next_at = self.since + WAIT_REPORT_S

    def poll(self, step: int) -> None:
        """Call while blocked: reports once :data:`WAIT_REPORT_S` s have passed, then every
        :data:`WAIT_REPEAT_S` s."""
        now = time.monotonic()
        if now < self.next_at:
            return
        self.next_at = now + WAIT_REPEAT_S
        rec = {
            "ts": time.time(),
            "event": "waiting",
            "rank": self.spec["rank"],
            "role": self.spec["role"],
            "step": step,
            "on": self.on,
            "waited_s": round(now - self.since, 3),
            "pid": os.getpid(),
        }
        self.log.metric(rec)


def wait_work(work: Any, reporter: WaitReporter, step: int, orphaned: Any) -> None:
    """Wait for an async collective ``work``, reporting while blocked; raise if the launcher is gone."""
    delay = 0.0005
    while not work.is_completed():
        reporter.poll(step)
        if orphaned():
            raise RuntimeError("launcher is gone")
        time.sleep(delay)
        delay = min(delay * 2, 0.05)
    work.wait()
