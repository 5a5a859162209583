"""The host helper's contract: each operation's arguments and answer, typed, for both sides.

:mod:`pipeline.host.helper` and :func:`pipeline.host.probe.call_helper` import these types, and
the helper ships this module inside its source, so it stays standard library only and Python 3.8
(``Optional``/``List``/``Dict``; 3.8 evaluates class-body annotations).  An operation takes
``OP`` (its argv) and a JSON object of its :class:`…Args` (stdin's first line) and prints its :class:`…Answer` or
``{"error": "..."}`` (:class:`pipeline.host.probe.Ops` pairs them).  A key of a ``total=False`` part may be left out;
``Optional[...]`` may be ``null``.  Units: times are unix seconds on the host's clock, durations
seconds, sizes bytes, ``start_time`` field 22 of ``/proc/PID/stat`` (clock ticks since boot).
"""

from __future__ import annotations

from typing import Dict, List, NamedTuple, Optional, Tuple, TypedDict, Union

HELPER_VERSION = 4  #: the helper protocol's version, on the first line of the shipped source
MARKER = "# pitstop-host-helper"  #: starts the shipped source: the helper's processes carry it


# --- /proc ----------------------------------------------------------------------------------------


class ProcStat(NamedTuple):
    """The fields of ``/proc/PID/stat`` the helper reads (fields 3, 4, 5, 6 and 22 of proc(5)) and,
    for a process its scan found, the command line."""

    state: str  #: ``R``, ``S``, ``D``, ``Z``, …
    ppid: int
    pgrp: int
    session: int
    start_time: int
    cmdline: bytes = b""  #: a scan's: NULs read as spaces, trailing space stripped


# --- pieces shared by several answers -------------------------------------------------------------


class Identity(TypedDict):
    """A recorded launch (``keys.job_current``): None each when there is no record."""

    pid: Optional[int]
    start_time: Optional[int]
    sid: Optional[int]


class _JobMatch(Identity):
    match: str  #: the job's ``match`` regex (``re.search`` on the command line)


class JobArgs(_JobMatch, total=False):
    """Which processes are the job's: its recorded session, else ``match`` inside ``workdir``."""

    name: Optional[str]
    workdir: Optional[str]


class ProbeJob(JobArgs, total=False):
    """A job to probe, its log file to look at, and a file to read (its metric log's new bytes)."""

    log: Optional[str]  #: report this file's size, mtime and inode too
    read: Optional[LogRead]  #: read these bytes too (zlib-compressed, as ``read`` with ``zlib``)
    processes: int  #: with ``tail_lines``: fewer processes than this bring back ``tail`` and ``status``
    tail_lines: int  #: the last lines of ``log`` to bring back for a job short of processes
    #: with ``tail_lines``: the log's size at launch; a job found dead whose waiter recorded its
    #: end at most ``crash_within`` s ago brings back the last ``crash_bytes`` since (``crash``)
    crash_from: Optional[int]
    crash_bytes: int
    crash_within: float


class FileInfo(TypedDict):
    """A file's size, mtime and inode (None each, and ``error``, if it cannot be read)."""

    size: Optional[int]
    mtime: Optional[float]
    inode: Optional[int]
    error: Optional[str]


class JobState(TypedDict, total=False):
    """One job's processes and log (only ``name`` and ``error`` when the probe of it failed)."""

    name: Optional[str]
    error: Optional[str]
    session_pids: List[int]  #: every member of the recorded session (else same as ``pids``)
    pids: List[int]  #: the job's processes
    count: int
    state: Optional[str]  #: ``alive`` / ``gone`` / ``stale``; None without a recorded pid
    alive: Optional[bool]
    log: FileInfo  #: present when ``log`` was asked
    read: ReadResult  #: present when ``read`` was asked and done (``if_running``: the job had processes)
    tail: str  #: the log's last lines: evidence (``evidence``) or, from a probe, of a job short of processes
    status: Optional[ExitRecord]  #: with ``tail``: the waiter's record of how the recorded pid ended
    crash: ReadResult  #: a probe's dead job with ``crash_from`` and ``status``: its log since launch (zlib)


class ExitRecord(TypedDict):
    """How a launched job ended, as its waiter recorded it."""

    pid: int
    start_time: Optional[int]
    started_at: float
    ended_at: float
    code: Optional[int]  #: exit status; None when a signal ended it
    signal: Optional[str]  #: ``SIGKILL`` …


class StartStep(TypedDict):
    """Where a run started: the step its log ``said`` it resumed at, the ``first`` step it logged."""

    said: Optional[int]
    first: Optional[int]


class Checkpoint(TypedDict):
    """The newest checkpoint: its step (None if its name has none), mtime and path."""

    step: Optional[int]
    mtime: float
    file: str


class CheckpointDamage(TypedDict):
    """What is wrong with a checkpoint directory: ``why`` is ``manifest`` (none, or unreadable),
    ``missing`` (``file`` is not there), ``size`` (``file`` has ``size`` bytes of ``expected``) or
    ``sha256`` (``file``'s bytes differ from its manifest's hash)."""

    why: str
    file: Optional[str]
    size: Optional[int]
    expected: Optional[int]


class CheckpointEntry(TypedDict):
    """One ``step-NNNNNN`` checkpoint directory (the convention: ``pipeline/dflash/checkpoints.py``)."""

    step: int
    path: str
    time: Optional[float]  #: its manifest's ``time`` (unix s, host clock), else the directory's mtime
    files: int  #: files its manifest names
    bytes: int  #: their sizes' sum, as the manifest says
    damage: Optional[CheckpointDamage]  #: None: intact
    verified: Optional[str]  #: ``size`` or ``sha256``: how it was checked and found intact; None: not


# --- operations -------------------------------------------------------------------------------------


class PreflightArgs(TypedDict):
    workdir: str
    program: str  #: the launch program (argv[0])
    log: str
    min_free: int  #: bytes the log's file system must have free
    patches: Dict[str, str]  #: patch name → ``apply`` / ``revert`` (diff texts on stdin)
    running: Optional[ProbeJob]  #: is this job running already?


class PreflightCheck(TypedDict):
    check: str  #: ``workdir``, ``launch``, ``log_dir``, ``disk``, ``patch``
    ok: bool
    detail: str


class PreflightAnswer(TypedDict):
    checks: List[PreflightCheck]
    applied: Dict[str, bool]  #: patch name → applied now
    running: Optional[JobState]


class StopArgs(_JobMatch):
    term_timeout: float  #: seconds between SIGTERM and SIGKILL
    kill_timeout: float  #: seconds to wait after SIGKILL
    workdir: Optional[str]


class StaleRecord(TypedDict):
    """The recorded pid now belongs to a process started at another time."""

    pid: int
    recorded: Optional[int]
    found: Optional[int]


class StopTarget(TypedDict):
    pid: int
    start_time: int
    cmdline: str


class StopAnswer(TypedDict):
    scope: str  #: ``session`` or ``match``
    state: Optional[str]  #: the recorded pid's: ``alive`` / ``gone`` / ``stale``
    stale: Optional[StaleRecord]
    targets: List[StopTarget]
    killed: List[int]  #: pids that needed SIGKILL
    survivors: List[int]
    seconds: float


class GpuWaitArgs(TypedDict):
    targets: List[Tuple[int, Optional[int]]]  #: ``(pid, start_time)`` as the job's side sees them
    timeout: float
    nvidia_smi: Optional[str]  #: None: ``nvidia-smi`` on PATH


class GpuHolder(TypedDict):
    pid: int  #: as the job's side sees it
    host_pid: int
    used_mib: Optional[int]


class GpuWaitAnswer(TypedDict):
    holders: List[GpuHolder]  #: targets still holding GPU memory at the end
    seconds: float


class ClearArgs(TypedDict):
    paths: List[str]


class ClearedPath(TypedDict):
    path: str
    missing: bool  #: the path did not exist
    files: int  #: files removed
    bytes: int  #: their size
    dirs: int  #: directories removed
    errors: List[str]


class ClearAnswer(TypedDict):
    cleared: List[ClearedPath]


class PatchesArgs(TypedDict):
    workdir: str


class PatchArgs(PatchesArgs, total=False):
    apply: List[str]
    revert: List[str]


class PatchAnswer(TypedDict):
    applied: List[str]
    reverted: List[str]
    kept: List[str]  #: asked to apply, applied already
    failed: List[str]  #: ``NAME: git's message``
    in_effect: List[str]


class PatchesAnswer(TypedDict):
    applied: Dict[str, bool]


class LaunchArgs(TypedDict):
    workdir: str
    argv: List[str]
    log: str
    name: str  #: for the waiter's title
    run_id: str


class LaunchAnswer(TypedDict):
    pid: int
    pgid: int
    sid: int
    start_time: Optional[int]
    launched_at: float
    log_size: int  #: the log's size before the job wrote to it


class ProbeArgs(TypedDict):
    jobs: List[ProbeJob]


class ProbeAnswer(TypedDict):
    jobs: Dict[str, JobState]  #: by job name
    time: float


class _EvidenceArgs(JobArgs):
    log: str


class EvidenceArgs(_EvidenceArgs, total=False):
    offset: int  #: the log's size at launch: only bytes after it count
    tail_lines: int
    progress_log: str  #: find where the run started (``start_step``) in this file
    progress_offset: int
    checkpoint_dir: Optional[str]  #: report the newest checkpoint in it


class EvidenceAnswer(JobState, total=False):
    new_bytes: Optional[int]
    error_line: Optional[str]
    start_step: StartStep
    checkpoint: Optional[Checkpoint]
    time: float


class _ReadArgs(TypedDict):
    path: str
    offset: int  #: negative: from the end
    max_bytes: int


class ReadArgs(_ReadArgs, total=False):
    inode: Optional[int]  #: start over at 0 when the path now holds another file
    zlib: bool


class LogRead(ReadArgs):
    """Bytes of a file to read in the same call as a probe (the metric log's new lines; always
    zlib-compressed)."""

    if_running: bool  #: read only when the job has processes


class ReadAnswer(TypedDict):
    data: str  #: base64 (of zlib-compressed bytes when ``zlib``)
    zlib: bool
    offset: int  #: where the next read starts
    size: int
    inode: Optional[int]
    reset: bool  #: reading started over at 0


ReadResult = Union[ReadAnswer, "ErrorAnswer"]  #: a probe's ``read``: the bytes, or why not


class TailArgs(TypedDict):
    path: str
    lines: int  #: the last lines, of the file's last 64 KiB at most


class TailAnswer(TypedDict):
    text: str
    size: int


class HangArgs(JobArgs, total=False):
    pids: List[int]  #: these processes instead of the job's (16 at most are looked at)


class HangProcess(TypedDict):
    pid: int
    state: Optional[str]
    wchan: Optional[str]
    cmdline: str
    stack: Optional[str]  #: ``py-spy dump`` output
    stack_error: Optional[str]


class HangAnswer(TypedDict):
    processes: List[HangProcess]
    py_spy: Optional[str]  #: py-spy's path, None when it is not installed
    time: float


class KernelOomArgs(TypedDict):
    lines: int  #: the newest OOM-killer lines kept


class KernelOomAnswer(TypedDict):
    lines: Optional[
        List[str]
    ]  #: the kernel's OOM-killer and Xid lines (``dmesg``), oldest first; None: unreadable
    unreadable: Optional[str]  #: why ``dmesg`` could not be read (``dmesg_restrict``, not installed)
    time: float


class CheckpointsArgs(TypedDict):
    dir: str
    sha256: bool  #: hash too: ``step``'s files, else each newest one down to the first intact
    step: Optional[int]


class CheckpointsAnswer(TypedDict):
    checkpoints: List[CheckpointEntry]  #: newest step first
    time: float


class SlurmTasksArgs(TypedDict):
    job: Union[str, int]  #: the Slurm job id
    match: str


class SlurmTasksAnswer(TypedDict):
    node: str
    pids: List[int]
    count: int
    time: float


class ErrorAnswer(TypedDict):
    """What the helper prints, with exit status 3, when an operation fails."""

    error: str
