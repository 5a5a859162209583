"""Calling Pitstop's host helper (:mod:`pipeline.host.helper`) over SSH, and the probes built on it.

The helper's source travels with every call, so nothing is installed on the host; it runs on
the job's side of the ``exec`` wrapper.  Process counts follow one rule everywhere: the job's
processes are the members of its recorded session (``sid``, from ``keys.job_current``) whose
``/proc/PID/cmdline`` (NULs read as spaces) matches the job's ``match`` regex (``re.search``);
without a recorded session, the user's matching processes, minus the helper's own ancestry.
"""

from __future__ import annotations

import ast
import asyncio
import base64
import json
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any, Generic, Protocol, TypeVar, cast

from pipeline import errors
from pipeline.config import JobConfig
from pipeline.host import contract as c
from pipeline.host.remote import RemoteHosts

HELPER_PYTHON = "python3"  #: interpreter for the helper on the job's side (Python 3.8+)
CONTRACT_MODULE = "pipeline.host.contract"  #: the helper's one Pitstop import, shipped inside it
PROBE_TIMEOUT = 20.0  #: seconds for one probe / read / tail call
CRASH_BYTES = 2 * 1024 * 1024  #: log bytes since the launch a crash is classified from (the last ones)
CRASH_FRESH = 60.0  #: seconds (at least 3 watch intervals) a death's log comes with the probe


@cache
def helper_source(op: str | None = None) -> str:
    """The helper program as sent to hosts: :mod:`pipeline.host.helper` with its contract in place
    of the import of it, as :func:`_module_tree` reads them, behind the marker line
    ``# pitstop-host-helper vHELPER_VERSION``.  Given ``op``, only what that operation runs
    (:func:`_only_op`): a host compiles the source on every call, and for ``probe`` — every host,
    every watch cycle — that is under a quarter of the whole (about 40 ms less CPU per call).
    """
    helper = _module_tree("helper.py")
    contract = [node for node in _module_tree("contract.py").body if not _is_future(node)]
    body: list[ast.stmt] = []
    for node in helper.body:
        is_contract = isinstance(node, ast.ImportFrom) and node.module == CONTRACT_MODULE
        body.extend(contract if is_contract else [node])
    helper.body = body if op is None else _only_op(body, op)
    return f"{c.MARKER} v{c.HELPER_VERSION}\n" + ast.unparse(helper) + "\n"


def _only_op(body: list[ast.stmt], op: str) -> list[ast.stmt]:
    """The helper's top-level statements that operation ``op`` needs, in their order: ``from
    __future__``, ``if`` blocks but ``if TYPE_CHECKING``, ``OPS`` with the one entry, and each
    definition (function, class, assignment, imported name) a kept statement names when it runs
    (:func:`_module_tree` left no annotations to name but class fields)."""
    kept: list[ast.stmt] = []
    for node in body:
        if _defined(node) == ["OPS"] and isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict):
            pairs = [
                (k, v)
                for k, v in zip(node.value.keys, node.value.values, strict=True)
                if isinstance(k, ast.Constant) and k.value == op
            ]
            node.value = ast.Dict(keys=[k for k, _ in pairs], values=[v for _, v in pairs])
            kept.append(node)
        elif _is_future(node) or (isinstance(node, ast.If) and "TYPE_CHECKING" not in _names(node.test)):
            kept.append(node)
    used: set[str] = set()
    todo = list(kept)
    while todo:
        for name in _names(todo.pop()) - used:
            used.add(name)
            todo += [node for node in body if name in _defined(node)]
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom) and not _is_future(node):
            node.names = [a for a in node.names if _bound(a) in used]
    return [node for node in body if node in kept or used & set(_defined(node))]


def _is_future(node: ast.stmt) -> bool:
    return isinstance(node, ast.ImportFrom) and node.module == "__future__"


def _bound(alias: ast.alias) -> str:
    return alias.asname or alias.name.split(".")[0]


def _defined(node: ast.stmt) -> list[str]:
    """The top-level names a statement defines."""
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return [node.name]
    if isinstance(node, ast.Assign):
        return [t.id for t in node.targets if isinstance(t, ast.Name)]
    if isinstance(node, ast.Import | ast.ImportFrom) and not _is_future(node):
        return [_bound(a) for a in node.names]
    return []


def _names(node: ast.AST) -> set[str]:
    """The names a statement holds (what it reads when it runs, and its own)."""
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _module_tree(filename: str) -> ast.Module:
    """A module of ``pipeline.host`` parsed, without what the helper never runs: docstrings, and
    annotations (``from __future__ import annotations``) but of class fields (TypedDict and
    NamedTuple read those): ``x: T = v`` becomes ``x = v``, ``x: T`` goes (an emptied body: ``pass``)."""
    tree = ast.parse((resources.files("pipeline.host") / filename).read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.arg):
            node.annotation = None
        if isinstance(node, ast.FunctionDef):
            node.returns = None
        if isinstance(node, ast.Module | ast.FunctionDef | ast.ClassDef) and ast.get_docstring(node, False):
            node.body = node.body[1:] or [ast.Pass()]
        for field in ("body", "orelse", "finalbody"):
            stmts = getattr(node, field, None)
            if isinstance(stmts, list) and stmts and not isinstance(node, ast.ClassDef):
                stmts = [
                    ast.Assign([s.target], s.value, lineno=s.lineno)
                    if isinstance(s, ast.AnnAssign) and s.value
                    else s
                    for s in stmts
                    if not isinstance(s, ast.AnnAssign) or s.value
                ]
                setattr(node, field, stmts or [ast.Pass()])
    return tree


def helper_argv(op: str) -> list[str]:
    """``[python3, -E, -S, -c, SOURCE, OP]``: the helper invocation for one operation, whose
    arguments go on its stdin (:func:`helper_input`), never on its command line (``-E -S``: no
    ``PYTHON*`` variables, no site-packages; it starts twice as fast without)."""
    return [HELPER_PYTHON, "-E", "-S", "-c", helper_source(op), op]


def helper_input(args: Mapping[str, object], stdin: str | None = None) -> str:
    """The helper's stdin: ``args`` as one line of JSON, then ``stdin`` (the operation's own input).

    On stdin, the arguments show in no ``ps`` of a shared host and no ``ARG_MAX`` (128 KiB a
    string on Linux) bounds them: a probe of 500 jobs is one call.
    """
    return json.dumps(args, separators=(",", ":")) + "\n" + (stdin or "")


A = TypeVar("A", bound=Mapping[str, Any])
R = TypeVar("R", bound=Mapping[str, Any])


class Op(Generic[A, R]):
    """A helper operation by ``name``, typed by its arguments ``A`` and its answer ``R``
    (:mod:`pipeline.host.contract`), so mypy checks :func:`call_helper`'s callers."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, args: A) -> tuple[Op[A, R], A]:
        """This operation with its ``args``, for :func:`call_helper`."""
        return self, args


class Ops:
    """Every operation of the helper with its contract; :func:`call_helper` runs them all but
    ``slurm_tasks``, which runs through srun (:meth:`pipeline.host.slurm.SlurmClient.query_with_reads`)."""

    preflight = Op[c.PreflightArgs, c.PreflightAnswer]("preflight")
    stop = Op[c.StopArgs, c.StopAnswer]("stop")
    gpu_wait = Op[c.GpuWaitArgs, c.GpuWaitAnswer]("gpu_wait")
    clear = Op[c.ClearArgs, c.ClearAnswer]("clear")
    patch = Op[c.PatchArgs, c.PatchAnswer]("patch")
    patches = Op[c.PatchesArgs, c.PatchesAnswer]("patches")
    launch = Op[c.LaunchArgs, c.LaunchAnswer]("launch")
    probe = Op[c.ProbeArgs, c.ProbeAnswer]("probe")
    evidence = Op[c.EvidenceArgs, c.EvidenceAnswer]("evidence")
    read = Op[c.ReadArgs, c.ReadAnswer]("read")
    tail = Op[c.TailArgs, c.TailAnswer]("tail")
    hang = Op[c.HangArgs, c.HangAnswer]("hang")
    kernel_oom = Op[c.KernelOomArgs, c.KernelOomAnswer]("kernel_oom")
    checkpoints = Op[c.CheckpointsArgs, c.CheckpointsAnswer]("checkpoints")
    slurm_tasks = Op[c.SlurmTasksArgs, c.SlurmTasksAnswer]("slurm_tasks")


async def call_helper(
    ssh: RemoteHosts,
    call: tuple[Op[A, R], A],
    *,
    job: str | None = None,
    host: str | None = None,
    exec_prefix: Sequence[str] | None = None,
    stdin: str | None = None,
    timeout: float = PROBE_TIMEOUT,
) -> R:
    """Run one helper operation with its arguments (``Ops.NAME(args)``: :class:`Ops`) and return
    its JSON answer as it came.

    The arguments and ``stdin`` (the operation's own input) reach the helper on its stdin
    (:func:`helper_input`).  Exactly one of ``job`` (the job's host behind its ``exec`` prefix) or ``host`` (the host
    itself, or behind ``exec_prefix`` when given) says where; ``timeout`` is in seconds.

    :raises RemoteCommandError: the helper failed (its ``error``), gave no answer, or its
        control shell was killed by a signal — named as such, never as empty output.
    :raises: as :meth:`pipeline.host.remote.SSHPool.run` (errors name the call without the source).
    """
    op, args = call
    argv, stdin = helper_argv(op.name), helper_input(args, stdin)
    shown = [HELPER_PYTHON, "-c", "<pitstop host helper>", op.name]  # the source is not worth showing
    if job is not None:
        result = await ssh.run_job(job, argv, timeout=timeout, stdin=stdin, display=shown)
    else:
        assert host is not None, "call_helper needs job or host"
        prefix = exec_prefix or ()
        result = await ssh.run(
            host, [*prefix, *argv], timeout=timeout, stdin=stdin, display=[*prefix, *shown]
        )
    if result.exit_signal is not None:
        raise result.error(shown, errors.shell_killed(result.host, shown, result.exit_signal))
    if result.exit_status == 127 and not result.stdout.strip():
        raise result.error(shown, errors.python_missing(result.host, HELPER_PYTHON))
    try:
        answer: Any = json.loads((result.stdout.strip().splitlines() or ["null"])[-1])
    except ValueError:
        answer = None
    if isinstance(answer, dict) and not answer.get("error"):
        return cast(R, answer)
    err = (result.stderr.strip().splitlines() or ["no output"])[-1]
    detail = f"exit status {result.exit_status}, no answer: {err[:300]}"
    detail = str(answer["error"]) if isinstance(answer, dict) else detail
    raise result.error(shown, errors.helper_failed(result.host, op.name, detail))


# --- the watcher's probe ------------------------------------------------------------------------


@dataclass(frozen=True)
class JobProbe:
    """One job as seen on its host at one moment (times: unix s, host clock)."""

    job: str
    pids: tuple[int, ...] = ()  #: the job's processes (session members matching ``match``)
    count: int = 0
    session_pids: tuple[int, ...] = ()  #: every member of the recorded session (else ``pids``)
    alive: bool | None = None  #: the recorded pid is alive with its start time; None without a record
    state: str | None = None  #: ``alive`` / ``gone`` / ``stale`` (pid reused by another process) / None
    log_size: int | None = None  #: bytes (None if the log cannot be read)
    log_mtime: float | None = None
    log_inode: int | None = None  #: a change means the log was replaced
    sampled_at: float | None = None
    error: str | None = None  #: why this job could not be probed (host unreachable, bad regex…)
    #: the bytes of the ``read`` asked for with the probe; None when none was asked, or it was
    #: asked ``if_running`` and the job had no process
    read: LogChunk | None = None
    read_error: str | None = None  #: why that read failed (the file is missing…)
    #: the log's last lines, for a job found short of processes when :func:`probe_host` asked
    tail: str | None = None
    exit_status: c.ExitRecord | None = None  #: with ``tail``: the waiter's record of how the pid ended
    #: with ``exit_status``, for a job with no process left that died recently and whose launch
    #: recorded its log's size (:func:`probe_args`): the last :data:`CRASH_BYTES` it wrote since
    crash: LogChunk | None = None
    #: read for a crash check whose log shows a SIGKILL without the kernel's own line: the host
    #: kernel's OOM-killer lines (``dmesg``); None when not read (or unreadable: ``kernel_unreadable``)
    kernel: tuple[str, ...] | None = None
    kernel_unreadable: str | None = None
    #: the job's GPUs are on its ``host`` (nvidia-smi there sees them); False when the engine runs it
    #: elsewhere (a Slurm job's host is the login node)
    host_gpus: bool = True


def parse_int(value: str | None) -> int | None:
    """``value`` as an int (``-3`` too); None when it is absent or not a whole number."""
    return int(value) if value and value.strip().lstrip("-").isdigit() else None


def recorded_identity(current: Mapping[str, str] | None) -> c.Identity:
    """``pid``, ``start_time``, ``sid`` from a ``keys.job_current`` hash (None each when absent
    or when the job is recorded as stopped)."""
    cur = current if current and current.get("state") != "stopped" else {}
    return cast(c.Identity, {key: parse_int(cur.get(key)) for key in c.Identity.__annotations__})


def probe_args(
    name: str,
    job: JobConfig,
    current: Mapping[str, str] | None,
    read: c.LogRead | None = None,
    tail_lines: int = 0,
) -> c.ProbeJob:
    """The helper's per-job probe arguments (``read``: a file's bytes to read in the same call;
    ``tail_lines``: the log lines to bring back if the job is short of processes, with its log
    since the launch — ``log_size`` in ``current`` — if it died within :data:`CRASH_FRESH` s or
    3 watch intervals: later, the crash check reads it itself, once)."""
    return {
        "name": name,
        "match": job.match,
        "workdir": job.workdir,
        "log": job.log,
        "read": read,
        "processes": job.processes,
        "tail_lines": tail_lines,
        "crash_from": parse_int((current or {}).get("log_size")),
        "crash_bytes": CRASH_BYTES,
        "crash_within": max(CRASH_FRESH, 3 * job.watch.interval),
        **recorded_identity(current),
    }


def _to_probe(name: str, raw: c.JobState, sampled_at: float | None) -> JobProbe:
    if raw.get("error"):
        return JobProbe(job=name, error=str(raw.get("error")), sampled_at=sampled_at)
    log: Mapping[str, Any] = raw.get("log") or {}
    got: Mapping[str, Any] | None = raw.get("read")
    crash: Mapping[str, Any] | None = raw.get("crash")
    return JobProbe(
        job=name,
        pids=tuple(raw.get("pids") or ()),
        count=int(raw.get("count") or 0),
        session_pids=tuple(raw.get("session_pids") or ()),
        alive=raw.get("alive"),
        state=raw.get("state"),
        log_size=log.get("size"),
        log_mtime=log.get("mtime"),
        log_inode=log.get("inode"),
        sampled_at=sampled_at,
        read=_chunk(cast(c.ReadAnswer, got)) if got and "error" not in got else None,
        read_error=str(got["error"]) if got and "error" in got else None,
        tail=raw.get("tail"),
        exit_status=raw.get("status"),
        crash=_chunk(cast(c.ReadAnswer, crash)) if crash and "error" not in crash else None,
    )


#: a job to probe: its name, its config and its ``keys.job_current`` hash (None: no record)
ProbeEntry = tuple[str, JobConfig, Mapping[str, str] | None]


async def probe_host(
    ssh: RemoteHosts,
    host: str,
    jobs: Sequence[ProbeEntry],
    reads: Mapping[str, c.LogRead] | None = None,
    *,
    tail_lines: int = 0,
) -> dict[str, JobProbe]:
    """Probe several jobs of one host: one SSH call per distinct ``exec`` prefix, run concurrently.

    Everything a watch cycle needs of a job comes back in that call (:class:`JobProbe`), with
    the bytes of its file range in ``reads`` and, given ``tail_lines``, how a job short of
    processes ended.  ``jobs``: ``(job name, job config, keys.job_current hash or None)`` each.
    A job whose call failed carries ``error`` (the failure's message) instead of raising.
    """
    reads = reads or {}
    groups: dict[tuple[str, ...], list[ProbeEntry]] = {}
    for entry in jobs:
        groups.setdefault(tuple(entry[1].exec), []).append(entry)

    async def one(prefix: tuple[str, ...], members: list[ProbeEntry]) -> dict[str, JobProbe]:
        jobs = [probe_args(n, j, cur, reads.get(n), tail_lines) for n, j, cur in members]
        try:
            answer = await call_helper(ssh, Ops.probe({"jobs": jobs}), host=host, exec_prefix=prefix)
        except Exception as exc:  # the watcher turns errors into "host unreachable", never raises
            message = getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}"
            return {n: JobProbe(job=n, error=message) for n, _, _ in members}
        raw = answer.get("jobs") or {}
        when = answer.get("time")
        return {n: _to_probe(n, raw.get(n) or {"error": "no answer"}, when) for n, _, _ in members}

    return {
        n: p for part in await asyncio.gather(*(one(*g) for g in groups.items())) for n, p in part.items()
    }


# --- logs -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LogChunk:
    """Bytes read from a log; the file's size and inode when read."""

    data: bytes
    offset: int  #: where the next read starts
    size: int
    inode: int | None
    reset: bool  #: reading started over at 0 (truncated, or a new file at the path)


class ChunkReader(Protocol):
    """:func:`read_log_chunk` without its SSH pool: how an engine reads a job's files
    (:meth:`pipeline.engines.base.Engine.read_chunk`)."""

    async def __call__(self, name: str, job: JobConfig, offset: int, length: int, *, path: str) -> LogChunk:
        """Up to ``length`` bytes of the job's file ``path`` from byte ``offset`` (negative: from the
        end), as :func:`read_log_chunk` reads them.  :raises PitstopError: if it cannot be read."""


async def read_log_chunk(
    ssh: RemoteHosts,
    job_name: str,
    job: JobConfig,
    offset: int,
    max_bytes: int,
    *,
    inode: int | None = None,
    path: str | None = None,
) -> LogChunk:
    """Read up to ``max_bytes`` of the job's log (or ``path``) from byte ``offset``.

    A negative ``offset`` counts from the end of the file (``-N``: its last ``N`` bytes), so the
    tail of a log is one call.  Starts over at 0 when the file is shorter than ``offset``
    (truncated) or, given ``inode``, when the path now holds another file (rotated).  The bytes
    travel zlib-compressed (level 1: a metric log shrinks over tenfold for a few ms per MiB).

    :raises RemoteCommandError: if the file cannot be read; else as :func:`call_helper`.
    """
    args: c.ReadArgs = {
        "path": path or job.log,
        "offset": offset,
        "max_bytes": max(0, max_bytes),
        "inode": inode,
        "zlib": True,
    }
    return _chunk(await call_helper(ssh, Ops.read(args), host=job.host, exec_prefix=job.exec))


def _chunk(answer: c.ReadAnswer) -> LogChunk:
    """A helper ``read`` answer (or a probe's) as a :class:`LogChunk`."""
    raw = base64.b64decode(answer["data"])
    data = zlib.decompress(raw) if answer["zlib"] else raw
    return LogChunk(data, answer["offset"], answer["size"], answer["inode"], answer["reset"])
