"""Crash classes: why a training job failed, read from the new log bytes of all its ranks.

:func:`classify` reads every line since the launch (or the last read), not just the tail: with
eight ranks in one log the last lines are collateral damage; the cause is one rank's first
failure line.  The rules, in order:

1. an ``Xid`` / ECC / "fallen off the bus" line anywhere, in the log or the host's kernel log
   (``dmesg``, when read: ``kernel``) → ``xid`` (the hardware explains the rest);
2. else the *earliest* failure line: a CUDA out-of-memory line → ``cuda_oom``; the NCCL watchdog's
   timeout → ``nccl_timeout``; another NCCL error → ``nccl_error``; a Python traceback → its
   exception line decides (an OOM or NCCL exception is that class, anything else
   ``python_exception`` with the exception's type and message);
3. else how a process ended: the kernel's own OOM line in the log (``Out of memory: Killed
   process``, ``oom-kill``, ``oom_reaper``) → ``host_oom``; a SIGKILL (the launcher's ``exited with
   code -9``, the shell's ``Killed``, the job's exit signal) → ``host_oom`` only when the host's
   kernel log (``dmesg``, read at classification: ``kernel``) has an OOM kill of one of the killed
   pids, else ``killed`` with the signal as evidence (an operator's ``kill -9``, a scheduler's
   kill at a time limit, a preemption); another signal or ``Segmentation fault`` / ``Fatal Python
   error`` → ``signal``;
4. else ``unknown``.

0. Before them all, the scheduler's own word: a job it ended ``PREEMPTED`` → ``preempted``, one
   that reached its time limit (``TIMEOUT``) → ``time_limit``; neither is a crash.  One it ended
   ``NODE_FAIL`` (a node of it failed) → ``node_fail``.

The failing rank comes from the lines just before the traceback (``dflash-worker drafter rank 6
failed:``), the evidence line, or the launcher's ``ROLE rank R (pid P) exited with code C``; the
step is the last ``step`` that rank logged (JSON metric lines) before the failure line.  Pure.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace

from pipeline.config.jobs import CrashClass
from pipeline.observe.metrics import parse_jsonl

MAX_EVIDENCE = 300  #: characters of the evidence line kept


@dataclass(frozen=True)
class Crash:
    """One classified failure."""

    kind: CrashClass
    evidence: str | None = None  #: the deciding line (stripped, at most :data:`MAX_EVIDENCE` chars)
    exc_type: str | None = None  #: a Python exception's type as printed (``torch.OutOfMemoryError``)
    message: str | None = None
    rank: int | None = None  #: the failing global rank, when the log names it
    step: int | None = None  #: the last step that rank (without a rank: any rank) logged before it
    exit_code: int | None = None  #: the job's own exit code, when known (a signal: None)

    @property
    def summary(self) -> str:
        """``nccl_timeout: [rank1]:[E …] Watchdog caught …`` — the class and its evidence line."""
        return f"{self.kind.value}: {self.evidence}" if self.evidence else self.kind.value

    def same_failure(self, other: Crash) -> bool:
        """Whether ``other`` is this Python exception again: same type at the same step."""
        same = (self.kind, self.exc_type, self.step) == (other.kind, other.exc_type, other.step)
        return same and self.kind is CrashClass.PYTHON_EXCEPTION and self.step is not None

    def to_fields(self) -> dict[str, str]:
        """Flat string fields (``crash_*``) to keep in a Redis hash; :func:`from_fields` reads them."""
        out = {f"crash_{k}": str(v) for k, v in vars(self).items() if v is not None and k != "kind"}
        return {"crash_class": self.kind.value, **out}


def from_fields(fields: Mapping[str, str]) -> Crash | None:
    """The :class:`Crash` stored by :meth:`Crash.to_fields`, or None if there is none."""
    if not (kind := fields.get("crash_class")) or kind not in CrashClass.__members__.values():
        return None
    rank, step, code = (
        int(v) if (v := fields.get(f"crash_{k}")) else None for k in ("rank", "step", "exit_code")
    )
    evidence, exc_type, message = (fields.get(f"crash_{k}") for k in ("evidence", "exc_type", "message"))
    return Crash(CrashClass(kind), evidence, exc_type, message, rank, step, code)


# _CUDA_OOM, _KERNEL_OOM and _SIGKILLED serve both classify() and detect_cause()
_CUDA_OOM = re.compile(r"CUDA out of memory|OutOfMemoryError|CUBLAS_STATUS_ALLOC_FAILED", re.IGNORECASE)
_KERNEL_OOM = re.compile(r"Out of memory: Killed process|oom-kill|oom_reaper", re.IGNORECASE)
_SIGKILLED = re.compile(r"^\s*Killed\s*$|\s(\d+)\s+Killed(?:\s|$)", re.MULTILINE)  #: the shell's line
#: the killed pid a kernel OOM line names (``Killed process 29343``, ``pid=29343``, ``reaped process 29343``)
_OOM_PID = re.compile(r"Killed process (\d+)|\bpid=(\d+)|reaped process (\d+)")
_XID = re.compile(r"NVRM: Xid|\bXid\b.*\d|uncorrectable ECC|ECC error|fallen off the bus", re.IGNORECASE)
_NCCL_TIMEOUT = re.compile(
    r"Watchdog caught collective operation timeout|NCCL.{0,80}(?:timed out|timeout)|Timeout at NCCL work",
    re.IGNORECASE,
)
_NCCL_ERROR = re.compile(
    r"NCCL error|nccl(?:Internal|System|Remote|UnhandledCuda|InvalidUsage|InvalidArgument)Error|DistBackendError"
)
_TRACEBACK = "Traceback (most recent call last):"
_CHAINED = ("During handling of the above exception", "The above exception was the direct cause")
_EXC = re.compile(r"^([A-Za-z_][\w.]*)(?::\s?(.*))?$")
_RANK = re.compile(r"\brank[ _]?(\d+)\b", re.IGNORECASE)
_LAUNCHER_EXIT = re.compile(r"\b(\w+) rank (\d+) \(pid (\d+)\) exited with code (-?\d+)")
#: the scheduler's end states that are its own stops, not crashes
_SCHEDULED = {"PREEMPTED": CrashClass.PREEMPTED, "TIMEOUT": CrashClass.TIME_LIMIT}
#: the scheduler's end states that decide the class whatever the log says (the ranks a node's
#: failure left behind die of its collateral: a lost peer, a cancelled step)
_SLURM_SAID = {**_SCHEDULED, "NODE_FAIL": CrashClass.NODE_FAIL}
_SIGNAL_LINE = re.compile(r"Segmentation fault|Fatal Python error|Aborted \(core dumped\)|Bus error")


def _short(line: str) -> str:
    line = line.strip()
    return line if len(line) <= MAX_EVIDENCE else line[: MAX_EVIDENCE - 1] + "…"


def _exception_at(lines: list[str], start: int) -> tuple[int, str, str | None] | None:
    """(index, type, message) of the exception line closing the traceback that starts at ``start``."""
    for i, ln in enumerate(lines[start + 1 :], start + 1):
        if not ln.strip() or ln.startswith((" ", "\t")) or ln.startswith(_TRACEBACK):
            continue
        if ln.startswith(_CHAINED):
            return None  # the traceback that follows holds the exception that ended the process
        m = _EXC.match(ln.strip())
        return (i, m.group(1), m.group(2)) if m else None
    return None


def _rank_near(lines: list[str], i: int) -> int | None:
    found = (m for ln in reversed(lines[max(0, i - 3) : i + 1]) if (m := _RANK.search(ln)))
    return next((int(m.group(1)) for m in found), None)


def _launcher_rank(lines: list[str]) -> int | None:
    found = (m for ln in lines if (m := _LAUNCHER_EXIT.search(ln)) and m.group(4) != "0")
    return next((int(m.group(2)) for m in found), None)


def _last_step(lines: list[str], before: int, rank: int | None) -> int | None:
    """The last ``step`` of ``rank`` in JSON metric lines before line ``before`` (no rank: the highest)."""
    data = "".join(f"{ln}\n" for ln in lines[:before] if ln.startswith("{") and '"step"' in ln).encode()
    steps = [m.step for m in parse_jsonl(data) if m.step is not None and rank in (None, m.rank)]
    return max(steps, default=None) if rank is None else (steps[-1] if steps else None)


def _named_class(text: str) -> CrashClass | None:
    """The class a failure line names itself (CUDA out of memory, an NCCL timeout or error), if any."""
    if _CUDA_OOM.search(text):
        return CrashClass.CUDA_OOM
    if _NCCL_TIMEOUT.search(text):
        return CrashClass.NCCL_TIMEOUT
    return CrashClass.NCCL_ERROR if _NCCL_ERROR.search(text) else None


def _oom_pid(line: str) -> int | None:
    m = _OOM_PID.search(line) if _KERNEL_OOM.search(line) else None
    return int(next(g for g in m.groups() if g)) if m else None


def _killed(
    line: str, pids: Collection[int], kernel: Sequence[str] | None, unreadable: str | None
) -> tuple[CrashClass, str]:
    """``host_oom`` with the kernel's line when it OOM-killed one of ``pids``, else ``killed``
    with the log's SIGKILL ``line`` (``''``: none, the exit signal said it) and what the kernel log
    said (the evidence)."""
    oom = [ln for ln in kernel or () if _oom_pid(ln) in pids]
    if oom:  # the kernel's own "Killed process" line says most, else its oom-kill: line
        return CrashClass.HOST_OOM, next((ln for ln in oom if "Killed process" in ln), oom[-1])
    who = ", ".join(f"pid {p}" for p in sorted(pids)) or "its processes"
    seen = kernel_words(kernel is not None, unreadable)
    return CrashClass.KILLED, f"{line}killed by SIGKILL, and {seen} no OOM kill of {who}"


def classify(
    data: bytes,
    *,
    exit_signal: str | None = None,
    exit_code: int | None = None,
    pids: Collection[int] = (),
    kernel: Sequence[str] | None = None,
    kernel_unreadable: str | None = None,
    end_state: str | None = None,
) -> Crash:
    """Classify a failure from the new log bytes of all ranks (the rules: module docstring), and
    the signal (``SIGKILL``) or exit code that ended the launched process, when known.

    :param pids: the run's recorded pids (its session leader), added to those the log names as
        killed (the launcher's ``(pid P) exited with code -9``, the shell's ``P Killed``).
    :param kernel: the host's kernel OOM-killer and Xid lines (``dmesg``); None when they were not read.
    :param kernel_unreadable: why ``dmesg`` could not be read (said in a ``killed`` evidence).
    :param end_state: the state the scheduler ended the job in (Slurm's ``PREEMPTED``, ``TIMEOUT``…).
    :returns: the crash, with ``exit_code``.
    """
    return replace(
        _classify(data, exit_signal, exit_code, pids, kernel, kernel_unreadable, end_state),
        exit_code=exit_code,
    )


def _classify(
    data: bytes,
    exit_signal: str | None,
    exit_code: int | None,
    pids: Collection[int],
    kernel: Sequence[str] | None,
    kernel_unreadable: str | None,
    end_state: str | None,
) -> Crash:
    """:func:`classify` without the exit code kept."""
    lines = [ln.rstrip() for ln in data.decode("utf-8", "replace").splitlines()]
    if (said := _SLURM_SAID.get(end_state or "")) is not None:
        rank = _launcher_rank(lines)
        return Crash(
            said, f"Slurm ended the job {end_state}", rank=rank, step=_last_step(lines, len(lines), rank)
        )
    for i, ln in enumerate(lines):
        if _XID.search(ln):
            rank = _rank_near(lines, i)
            return Crash(CrashClass.XID, _short(ln), rank=rank, step=_last_step(lines, i, rank))
    if found := next((ln for ln in kernel or () if _XID.search(ln)), None):
        rank = _launcher_rank(lines)
        return Crash(CrashClass.XID, _short(found), rank=rank, step=_last_step(lines, len(lines), rank))
    for i, ln in enumerate(lines):  # the earliest failure line: one naming its class, or a traceback's
        etype = msg = None
        if ln.startswith(_TRACEBACK):
            if (exc := _exception_at(lines, i)) is None:
                continue
            i, etype, msg = exc  # its exception line
        kind = _named_class(lines[i]) or (CrashClass.PYTHON_EXCEPTION if etype is not None else None)
        if kind is None:
            continue
        tb = max(k for k in range(i + 1) if lines[k].startswith(_TRACEBACK)) if etype is not None else 0
        # the lines just before its traceback name the rank, else the launcher names the process
        # that died (a ``[rankN]`` may be a group rank), else the lines around the failure line
        ranks = (_rank_near(lines, tb - 1) if tb > 0 else None, _launcher_rank(lines), _rank_near(lines, i))
        rank = next((r for r in ranks if r is not None), None)
        return Crash(kind, _short(lines[i]), etype, msg, rank, _last_step(lines, i, rank))
    rank = _launcher_rank(lines)
    for i, ln in enumerate(lines):  # the kernel's own line in the log
        if _KERNEL_OOM.search(ln):
            return Crash(CrashClass.HOST_OOM, _short(ln), rank=rank, step=_last_step(lines, i, rank))
    killed = {int(m.group(3)) for ln in lines if (m := _LAUNCHER_EXIT.search(ln)) and m.group(4) == "-9"}
    killed |= {int(m.group(1)) for m in _SIGKILLED.finditer("\n".join(lines)) if m.group(1)}
    killed |= set(pids)
    for i, ln in enumerate(lines):
        code = int(m.group(4)) if (m := _LAUNCHER_EXIT.search(ln)) else 0
        if _SIGKILLED.search(ln) or code == -9:
            kind, why = _killed(f"{ln.strip()}: ", killed, kernel, kernel_unreadable)
            return Crash(kind, _short(why), rank=rank, step=_last_step(lines, i, rank))
        if _SIGNAL_LINE.search(ln) or code < 0:
            return Crash(CrashClass.SIGNAL, _short(ln), rank=rank, step=_last_step(lines, i, rank))
    step = _last_step(lines, len(lines), rank)
    if exit_signal == "SIGKILL":
        kind, why = _killed("", killed, kernel, kernel_unreadable)
        return Crash(kind, _short(why), rank=rank, step=step)
    if exit_signal:
        return Crash(CrashClass.SIGNAL, f"the job was ended by {exit_signal}", rank=rank, step=step)
    evidence = f"exit code {exit_code}, no failure line in the log" if exit_code is not None else None
    return Crash(CrashClass.UNKNOWN, evidence, rank=rank, step=step)


# --- causes found in a log tail ------------------------------------------------------------------

_INDENT = (" ", "\t", "Traceback")
_EXC_LINE = re.compile(
    r"^(?:[A-Za-z_][\w.]*)(?:Error|Exception|Interrupt|Exit|Warning|Failure)\b.*$|^[A-Za-z_][\w.]*: .+$"
)
_NCCL = re.compile(
    r"NCCL.*(?:timeout|timed out|watchdog)|(?:Watchdog|watchdog).*NCCL|ProcessGroupNCCL", re.IGNORECASE
)


def detect_cause(log_tail: str) -> str | None:
    """A one-line cause found in the last lines of a log, or None: most specific first, CUDA out
    of memory (``CUDA out of memory: torch.OutOfMemoryError: …``), an NCCL timeout or watchdog, a
    Python traceback (its last exception line), ``Killed`` (the kernel's OOM killer)."""
    lines = [ln.rstrip() for ln in log_tail.splitlines() if ln.strip()]
    for rx, what in ((_CUDA_OOM, "CUDA out of memory"), (_NCCL, "NCCL timeout/watchdog")):
        if found := next((ln for ln in reversed(lines) if rx.search(ln)), None):
            return f"{what}: {found.strip()}"
    starts = [i for i, ln in enumerate(lines) if ln.startswith(_TRACEBACK)]
    after = lines[starts[-1] + 1 :] if starts else []  # the exception line closing the last traceback
    if exc := next((ln.strip() for ln in after if not ln.startswith(_INDENT) and _EXC_LINE.match(ln)), None):
        return f"Python exception: {exc}"
    last = lines[-5:]
    if oom := next((ln.strip() for ln in reversed(last) if _KERNEL_OOM.search(ln)), None):
        return f"killed by the kernel's OOM killer: {oom}"
    if _SIGKILLED.search("\n".join(last)):
        return "killed by SIGKILL (`Killed`; no OOM line in the log)"
    return None


def at_time_limit(crash: Crash, checkpoint: int | None) -> Crash:
    """A ``time_limit`` crash told with the step it reached and the newest intact checkpoint
    (``reached its time limit at step 412, checkpoint at step 400 (Slurm: TIMEOUT)``); any other as it is.

    :param checkpoint: the newest intact checkpoint's step (None: none, or none could be read).
    """
    if crash.kind is not CrashClass.TIME_LIMIT:
        return crash
    return replace(crash, evidence=time_limit_words(crash.step, checkpoint))


# --- text ---------------------------------------------------------------------------------------


def time_limit_words(step: int | None, checkpoint: int | None) -> str:
    """``reached its time limit at step 412, checkpoint at step 400 (Slurm: TIMEOUT)``."""
    at = f" at step {step}" if step is not None else ""
    saved = f"checkpoint at step {checkpoint}" if checkpoint is not None else "no checkpoint"
    return f"reached its time limit{at}, {saved} (Slurm: TIMEOUT)"


def kernel_words(read: bool, unreadable: str | None) -> str:
    """How the host's kernel log was consulted, before "no OOM kill of …": ``the host's dmesg has``,
    or ``the host's dmesg could not be read (WHY), so it shows``."""
    if read:
        return "the host's dmesg has"
    why = f" ({unreadable})" if unreadable else ""
    return f"the host's dmesg could not be read{why}, so it shows"
