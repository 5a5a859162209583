# pitstop-host-helper (the protocol and its version: pipeline/host/contract.py)
"""Pitstop's helper on the GPU host: one small program, standard library only (Python 3.8+).

Pitstop sends this file's source over SSH and runs it as ``python3 -c SOURCE OP JSON``
(through the job's ``exec`` wrapper when the work is inside a container).  It reads
``/proc`` itself instead of calling ``ps``/``kill`` by pattern from a shell, so it never
matches, counts or signals the shell that runs it: every operation excludes the helper's own
ancestry (its pid and all its parents) and any other copy of the helper (recognised by the
marker on the first line of this file), and looks only at processes of the helper's own
user.  It prints one JSON object on stdout and exits 0; a failure is reported as
``{"error": "..."}`` with exit status 3.

Operations (``OP``; ``JSON`` holds the arguments, larger inputs such as diffs come on stdin):

- ``preflight``: workdir, launch program, log directory, free space, patches apply — all at once.
- ``stop``: SIGTERM to the recorded session's process groups, poll, SIGKILL after a deadline,
  confirm nothing is left; refuses to signal a recorded pid whose start time differs.
- ``gpu_wait``: poll ``nvidia-smi`` until none of the given processes holds GPU memory
  (host PIDs mapped through ``NSpid`` for containers).
- ``clear``, ``patch``: clear cache paths, ``git apply`` / ``git apply -R`` named diffs.
- ``launch``: start the job detached in a new session, stdin ``/dev/null``, output appended to
  the log; returns pid, start time and log size at once.  A waiter process outside the job's
  session records the job's exit status in a file next to the log.
- ``probe``, ``evidence``, ``read``, ``tail``: process counts, liveness, log size, log bytes
  (``probe`` covers every job of a host in one call, each job's metric-log bytes included).
- ``hang``: what a person would look at for a hung job: each process's state and ``wchan`` from
  ``/proc``, and its Python stacks from ``py-spy dump`` when py-spy is installed.

Each operation's arguments and answer are typed in :mod:`pipeline.host.contract`, the one
Pitstop module this one imports: :func:`pipeline.host.probe.helper_source` ships the contract
inside the helper's source, in place of that import.  This module is also importable (tests
exercise its functions locally); it must import nothing else from Pitstop.
"""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import zlib
from typing import TYPE_CHECKING, Any, cast

from pipeline.host.contract import (
    MARKER,
    Checkpoint,
    ClearAnswer,
    ClearArgs,
    ClearedPath,
    ErrorAnswer,
    EvidenceAnswer,
    EvidenceArgs,
    ExitRecord,
    FileInfo,
    GpuHolder,
    GpuWaitAnswer,
    GpuWaitArgs,
    HangAnswer,
    HangArgs,
    HangProcess,
    JobArgs,
    JobState,
    LaunchAnswer,
    LaunchArgs,
    PatchAnswer,
    PatchArgs,
    PatchesAnswer,
    PatchesArgs,
    PreflightAnswer,
    PreflightArgs,
    PreflightCheck,
    ProbeAnswer,
    ProbeArgs,
    ProbeJob,
    ProcInfo,
    ProcStat,
    ReadAnswer,
    ReadArgs,
    SlurmTasksAnswer,
    SlurmTasksArgs,
    StaleRecord,
    StartStep,
    StopAnswer,
    StopArgs,
    StopTarget,
    TailAnswer,
    TailArgs,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    Procs = dict[int, ProcInfo]

MARK = MARKER.encode()

#: The waiter (see :func:`op_launch`): outside the job's session, it starts the job, reports
#: its identity through the pipe ``wfd``, waits for it and writes how it ended to ``status``.
#: Its command line carries no part of the job's: the spec (argv, workdir, log) arrives in an
#: unlinked file on descriptor ``argv[1]``, and the waiter retitles itself
#: ``pitstop-waiter JOB RUN_ID`` (comm ``pitstop-waiter``), so a person counting or killing
#: processes by the job's own pattern on the host sees trainers only and keeps the exit record.
WAITER = """# pitstop-host-helper waiter: runs one job detached, records how it ended
import json, os, signal, subprocess, sys, time
with os.fdopen(int(sys.argv[1]), "rb") as f:
    a = json.loads(f.read().decode())
try:
    import ctypes
    title = ("%s %s %s" % (WAITER_TITLE, a["name"], a["run_id"])).encode()
    with open("/proc/self/stat", "rb") as f:
        rest = f.read().rsplit(b")", 1)[1].split()
    start, end = int(rest[45]), int(rest[46])  # arg_start, arg_end: fields 48 and 49 of proc(5)
    if 0 < len(title) < end - start:
        ctypes.memmove(start, title + b"\\0" * (end - start - len(title)), end - start)
    ctypes.CDLL(None).prctl(15, WAITER_TITLE.encode(), 0, 0, 0)  # PR_SET_NAME: comm, 15 bytes at most
except Exception:
    pass  # the title is for people; the command line carries no part of the job's either way
wfd, logfd = a["wfd"], a["logfd"]
try:
    job = subprocess.Popen(a["argv"], cwd=a["workdir"], stdin=subprocess.DEVNULL, stdout=logfd,
                           stderr=logfd, close_fds=True, start_new_session=True)
except OSError as exc:
    os.write(wfd, json.dumps({"error": "cannot start %s: %s" % (a["argv"][0], exc.strerror or exc)}).encode())
    sys.exit(0)
started = time.time()
try:
    with open("/proc/%d/stat" % job.pid, "rb") as f:
        start_time = int(f.read().rsplit(b")", 1)[1].split()[19])
except (OSError, IndexError, ValueError):
    start_time = None
os.close(logfd)
os.write(wfd, json.dumps({"pid": job.pid, "pgid": job.pid, "sid": job.pid, "start_time": start_time,
                          "launched_at": started}).encode())
os.close(wfd)
code = job.wait()
record = {"pid": job.pid, "start_time": start_time, "started_at": started, "ended_at": time.time(),
          "code": code if code >= 0 else None, "signal": signal.Signals(-code).name if code < 0 else None}
tmp = "%s.%d.tmp" % (a["status"], os.getpid())
try:
    with open(tmp, "w") as f:
        json.dump(record, f)
    os.replace(tmp, a["status"])
except OSError:
    pass
"""
WAITER_TITLE = "pitstop-waiter"  #: the waiter's comm and the first word of its command line
WAITER = WAITER.replace("WAITER_TITLE", repr(WAITER_TITLE))
ERROR_RX = re.compile(rb"Traceback \(most recent call last\)|\w*Error\b|\bKilled\b")
POLL = 0.1


# --- /proc ------------------------------------------------------------------------------------


def proc_stat(pid: int) -> ProcStat | None:
    """:class:`~pipeline.host.contract.ProcStat` of ``pid``, or None if it is gone.

    The comm field may hold spaces and parentheses: fields are split after the last ``)``.
    ``start_time`` is field 22 (clock ticks since boot).
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    rest = data[data.rindex(b")") + 2 :].split()
    return ProcStat(rest[0].decode(), int(rest[1]), int(rest[2]), int(rest[3]), int(rest[19]))


def proc_cmdline(pid: int) -> bytes:
    """``/proc/PID/cmdline`` with NULs read as spaces, trailing space stripped ('' if gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read()
    except OSError:
        return b""
    return raw.replace(b"\0", b" ").rstrip(b" ")


def proc_uid(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def ancestry() -> set[int]:
    """The helper's own pid and every parent up to pid 1."""
    out: set[int] = set()
    pid = os.getpid()
    while pid > 0 and pid not in out:
        out.add(pid)
        st = proc_stat(pid)
        if st is None:
            break
        pid = st.ppid
    return out


def scan(sessions: set[int] | None = None, keep: Callable[[bytes], bool] | None = None) -> Procs:
    """Live processes of the helper's user, minus its ancestry and other helpers.

    A probe that needs only some processes says which, and the rest cost one ``stat`` each
    instead of two reads: ``sessions``, only members of these sessions (their command lines are
    read after ``/proc/PID/stat``); ``keep``, only processes whose command line it accepts (their
    ``/proc/PID/stat`` is read after).

    :returns: dict pid → :class:`~pipeline.host.contract.ProcInfo`.
    """
    me = os.getuid()
    skip = ancestry()
    out: Procs = {}
    waiter = WAITER_TITLE.encode() + b" "
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        if pid in skip or proc_uid(pid) != me:
            continue
        cmd = b""
        if keep is not None:
            cmd = proc_cmdline(pid)
            if not keep(cmd):
                continue
        st = proc_stat(pid)
        if st is None or st.state in ("Z", "X") or (sessions is not None and st.session not in sessions):
            continue
        if keep is None:
            cmd = proc_cmdline(pid)
        if MARK in cmd or cmd.startswith(waiter):
            continue
        out[pid] = ProcInfo(st.ppid, st.pgrp, st.session, st.start_time, cmd)
    return out


def probe_scan(jobs: list[ProbeJob]) -> Procs:
    """:func:`scan` narrowed to what ``jobs`` can count: their recorded sessions when every job has
    one, the command lines one of their ``match`` patterns finds when none has; else everything."""
    sids = {j.get("sid") for j in jobs}
    if jobs and None not in sids:
        return scan(sessions={int(s) for s in sids if s is not None})
    if jobs and sids == {None}:
        rxs = []
        for j in jobs:
            try:
                rxs.append(re.compile(j["match"]))
            except re.error:
                pass  # reported by probe_one for that job alone
        return scan(keep=lambda cmd: any(rx.search(cmd.decode("utf-8", "replace")) for rx in rxs))
    return scan()


def matches(rx: re.Pattern[str], cmd: bytes) -> bool:
    """True if ``rx`` is found in the command line (read as UTF-8)."""
    return rx.search(cmd.decode("utf-8", "replace")) is not None


def alive(pid: int, start_time: int | None) -> bool:
    """True if ``pid`` exists (not a zombie) with this start time."""
    st = proc_stat(pid)
    return (
        st is not None and st.state not in ("Z", "X") and (start_time is None or st.start_time == start_time)
    )


def identity(pid: int, start_time: int | None) -> tuple[str, int | None]:
    """'alive', 'gone' or 'stale' (the pid now belongs to a process with another start time)."""
    st = proc_stat(pid)
    if st is None or st.state in ("Z", "X"):
        return "gone", None
    if start_time is not None and st.start_time != start_time:
        return "stale", st.start_time
    return "alive", st.start_time


def session_view(procs: Procs, sid: int, rx: re.Pattern[str]) -> tuple[list[int], list[int]]:
    """Members of session ``sid``: all pids, and those whose cmdline matches ``rx``."""
    members = sorted(p for p, v in procs.items() if v.session == sid)
    matching = [p for p in members if matches(rx, procs[p].cmdline)]
    return members, matching


def in_workdir(pid: int, workdir: str | None) -> bool:
    """True if ``workdir`` is None, or the process's working directory lies inside it."""
    if not workdir:
        return True
    try:
        cwd = os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return False
    root = os.path.realpath(workdir).rstrip("/") + "/"
    return (cwd.rstrip("/") + "/").startswith(root)


def user_matching(procs: Procs, rx: re.Pattern[str], workdir: str | None = None) -> list[int]:
    """The user's processes whose command line matches ``rx`` and that run inside ``workdir``.

    Without a recorded session this is how a job's processes are recognised; the working
    directory keeps another copy of the same program (another job, another checkout) out.
    """
    return sorted(p for p, v in procs.items() if matches(rx, v.cmdline) and in_workdir(p, workdir))


def descendants(procs: Procs, roots: list[int]) -> set[int]:
    """``roots`` and every process below them (by parent pid)."""
    out = set(roots)
    changed = True
    while changed:
        changed = False
        for pid, v in procs.items():
            if pid not in out and v.ppid in out:
                out.add(pid)
                changed = True
    return out


# --- logs -------------------------------------------------------------------------------------


def file_info(path: str) -> FileInfo:
    """Size, mtime and inode of ``path`` (None each, and ``error``, if it cannot be read)."""
    try:
        st = os.stat(path)
    except OSError as exc:
        return {"size": None, "mtime": None, "inode": None, "error": f"{path}: {exc.strerror}"}
    return {"size": st.st_size, "mtime": st.st_mtime, "inode": st.st_ino, "error": None}


def read_range(path: str, start: int, max_bytes: int) -> bytes:
    """Up to ``max_bytes`` bytes of ``path`` from byte ``start``."""
    with open(path, "rb") as f:
        f.seek(start)
        return f.read(max_bytes)


def tail_bytes(path: str, start: int, lines: int, max_bytes: int = 65536) -> bytes:
    """The last ``lines`` lines of ``path`` written at or after byte ``start``."""
    try:
        size = os.stat(path).st_size
    except OSError:
        return b""
    if size < start:  # truncated since: everything is new
        start = 0
    begin = max(start, size - max_bytes)
    data = read_range(path, begin, size - begin)
    if begin > start and b"\n" in data:
        data = data[data.index(b"\n") + 1 :]
    parts = data.splitlines()
    return b"\n".join(parts[-lines:]) if lines > 0 else b""


def first_error(path: str, start: int, max_bytes: int = 1 << 20) -> str | None:
    """The first line holding a traceback / ``…Error`` / ``Killed`` written after ``start``."""
    try:
        size = os.stat(path).st_size
    except OSError:
        return None
    if size < start:
        start = 0
    begin = max(start, size - max_bytes)
    data = read_range(path, begin, size - begin)
    m = ERROR_RX.search(data)
    if m is None:
        return None
    line_start = data.rfind(b"\n", 0, m.start()) + 1
    line_end = data.find(b"\n", m.end())
    line = data[line_start : line_end if line_end >= 0 else len(data)]
    return line.decode("utf-8", "replace").strip()[:300]


RESUME_RX = re.compile(rb"\bresume_step=(\d+)|\bresum(?:ed|ing) (?:at|from) step (\d+)", re.IGNORECASE)


def start_step(path: str, start: int, max_bytes: int = 1 << 20) -> StartStep:
    """Where a run started, from the first bytes it wrote after ``start``.

    ``said``: the step a ``resume_step=N`` / ``resumed at step N`` line names; ``first``: the
    largest first ``step`` among the ranks' JSON metric lines, minus one (a rank that resumed
    from N logs N+1 first; one that started afresh logs 1).  None each when not found.
    """
    try:
        size = os.stat(path).st_size
    except OSError:
        return {"said": None, "first": None}
    if size < start:
        start = 0
    data = read_range(path, start, min(max_bytes, size - start))
    m = RESUME_RX.search(data)
    said = int(m.group(1) or m.group(2)) if m else None
    firsts = {}  # type: dict[object, int]
    for line in data.splitlines():
        if not line.startswith(b"{") or b'"step"' not in line:
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if (
            isinstance(rec, dict)
            and "role" in rec
            and "event" not in rec
            and isinstance(rec.get("step"), int)
        ):
            firsts.setdefault(rec.get("rank"), rec["step"])
    first = max(firsts.values()) - 1 if firsts else None
    return {"said": said, "first": max(first, 0) if first is not None else None}


def checkpoint_info(directory: str) -> Checkpoint | None:
    """The newest checkpoint in ``directory``: ``{"step", "mtime", "file"}``, or None if there is none.

    ``latest.json`` (``{"step": N}``, the reference pipeline's) decides when present; otherwise the
    newest file, its step the last number in its name (``step_12000.pt``; None without one).
    """
    latest = os.path.join(directory, "latest.json")
    try:
        with open(latest, "rb") as f:
            raw = json.loads(f.read().decode("utf-8", "replace"))
        if isinstance(raw, dict) and isinstance(raw.get("step"), int):
            return {"step": raw["step"], "mtime": os.stat(latest).st_mtime, "file": latest}
    except (OSError, ValueError):
        pass
    try:
        entries = [e for e in os.scandir(directory) if e.is_file() and not e.name.startswith(".")]
    except OSError:
        return None
    if not entries:
        return None
    newest = max(entries, key=lambda e: e.stat().st_mtime)
    nums = re.findall(r"\d+", newest.name)
    return {"step": int(nums[-1]) if nums else None, "mtime": newest.stat().st_mtime, "file": newest.path}


def status_path(log: str) -> str:
    """The file the waiter writes the job's exit status to: ``.LOGNAME.pitstop-exit`` beside the log."""
    d, base = os.path.split(log)
    return os.path.join(d, f".{base}.pitstop-exit")


def read_status(log: str, pid: int, start_time: int | None) -> ExitRecord | None:
    """The recorded end of the job ``pid`` (None while it runs, or for another job)."""
    try:
        with open(status_path(log)) as f:
            st: ExitRecord = json.load(f)
    except (OSError, ValueError):
        return None
    if st.get("pid") != pid or (start_time is not None and st.get("start_time") != start_time):
        return None
    return st


# --- operations -------------------------------------------------------------------------------


def git(workdir: str, args: list[str], text: str) -> tuple[bool, str]:
    """Run ``git ARGS`` in ``workdir`` with ``text`` on stdin: (succeeded, first output)."""
    proc = subprocess.run(
        ["git", *args],
        cwd=workdir,
        input=text.encode(),
        capture_output=True,
        check=False,
    )
    out = (proc.stderr or proc.stdout).decode("utf-8", "replace").strip()
    return proc.returncode == 0, out


def patch_state(workdir: str, text: str) -> tuple[str, str]:
    """'applied', 'applicable' or 'conflict' (with git's message)."""
    ok, _ = git(workdir, ["apply", "--reverse", "--check", "-"], text)
    if ok:
        return "applied", ""
    ok, msg = git(workdir, ["apply", "--check", "-"], text)
    if ok:
        return "applicable", ""
    return "conflict", msg.splitlines()[0] if msg else "does not apply"


def read_stdin_json() -> Any:
    """The JSON document on stdin, or None if stdin is empty."""
    data = sys.stdin.read()
    if not data.strip():
        return None
    return json.loads(data)


def op_preflight(a: PreflightArgs) -> PreflightAnswer:
    """All pre-flight checks in one go; nothing is changed."""
    checks: list[PreflightCheck] = []

    def check(name: str, ok: bool, detail: str = "") -> bool:
        checks.append({"check": name, "ok": bool(ok), "detail": detail})
        return ok

    workdir = a["workdir"]
    if check(
        "workdir", os.path.isdir(workdir), "" if os.path.isdir(workdir) else f"{workdir}: no such directory"
    ):
        prog = a["program"]
        if "/" in prog:
            path = prog if prog.startswith("/") else os.path.normpath(os.path.join(workdir, prog))
            ok = os.path.isfile(path) and os.access(path, os.X_OK)
            check("launch", ok, "" if ok else f"{path}: not an executable file")
        else:
            found = None
            for d in os.environ.get("PATH", "").split(os.pathsep):
                cand = os.path.join(d, prog)
                if os.path.isfile(cand) and os.access(cand, os.X_OK):
                    found = cand
                    break
            check("launch", found is not None, "" if found else f"{prog}: not found on PATH")
    logdir = os.path.dirname(a["log"]) or "/"
    if not os.path.isdir(logdir):
        check("log_dir", False, f"{logdir}: no such directory")
    elif not os.access(logdir, os.W_OK | os.X_OK) or (
        os.path.exists(a["log"]) and not os.access(a["log"], os.W_OK)
    ):
        check("log_dir", False, f"{a['log'] if os.path.exists(a['log']) else logdir}: not writable")
    else:
        check("log_dir", True)
        st = os.statvfs(logdir)
        free = st.f_bavail * st.f_frsize
        ok = free >= a["min_free"]
        check(
            "disk",
            ok,
            f"{free // 10**6} MB free in {logdir} (need {a['min_free'] // 10**6} MB)",
        )
    applied: dict[str, bool] = {}
    wants = a.get("patches") or {}
    if wants:
        texts = read_stdin_json()
        if texts is None:
            check(
                "patch",
                False,
                "no patch text arrived on stdin (does the exec wrapper forward stdin? docker exec needs -i)",
            )
        elif os.path.isdir(workdir):
            for name in sorted(wants):
                state, msg = patch_state(workdir, texts[name])
                applied[name] = state == "applied"
                want = wants[name]
                if want == "apply" and state == "conflict":
                    check("patch", False, f"{name} does not apply: {msg}")
                elif want == "revert" and state == "conflict":
                    check("patch", False, f"{name} cannot be reverted: {msg}")
    running = None
    r = a.get("running")
    if r:
        running = probe_one(scan(), r, r.get("log"))
    return {"checks": checks, "applied": applied, "running": running}


def op_stop(a: StopArgs) -> StopAnswer:
    """SIGTERM, poll, SIGKILL after ``term_timeout``, confirm: see the module docstring."""
    rx = re.compile(a["match"])
    pid, start, sid = a.get("pid"), a.get("start_time"), a.get("sid")
    began = time.time()
    procs = scan()
    stale: StaleRecord | None = None
    state = None
    if pid is not None:
        state, now_start = identity(pid, start)
        if state == "stale":
            stale = {"pid": pid, "recorded": start, "found": now_start}
    if sid is not None and stale is None:
        targets = {p: v for p, v in procs.items() if v.session == sid}
        scope = "session"
    else:
        roots = user_matching(procs, rx, a.get("workdir"))
        if stale is not None:  # never the pid that now belongs to someone else, nor its session
            roots = [p for p in roots if p != pid and procs[p].session != pid]
        targets = {p: procs[p] for p in descendants(procs, roots)}
        scope = "match"
    ident: dict[int, int | None] = {p: v.start_time for p, v in targets.items()}
    info: list[StopTarget] = [
        {"pid": p, "start_time": v.start_time, "cmdline": v.cmdline.decode("utf-8", "replace")[:200]}
        for p, v in sorted(targets.items())
    ]

    def left() -> list[int]:
        return sorted(p for p, st in ident.items() if alive(p, st))

    def send(sig: int, pids: list[int]) -> None:
        groups: set[int] = set()
        for p in pids:
            st = proc_stat(p)
            if st is None or st.start_time != ident[p]:
                continue
            if scope == "session" and st.session == sid:
                groups.add(st.pgrp)
            else:
                try:
                    os.kill(p, sig)
                except (ProcessLookupError, PermissionError):
                    pass
        for g in groups:
            try:
                os.killpg(g, sig)
            except (ProcessLookupError, PermissionError):
                pass

    killed: list[int] = []
    if targets:
        send(signal.SIGTERM, list(targets))
        deadline = time.monotonic() + a["term_timeout"]
        while left() and time.monotonic() < deadline:
            time.sleep(POLL)
        killed = left()
        if killed:
            send(signal.SIGKILL, killed)
            deadline = time.monotonic() + a["kill_timeout"]
            while left() and time.monotonic() < deadline:
                time.sleep(POLL)
        if scope == "session":  # anything that joined the session meanwhile
            late = {p: v.start_time for p, v in scan().items() if v.session == sid and p not in ident}
            ident.update(late)
            if late:
                send(signal.SIGKILL, list(late))
                deadline = time.monotonic() + a["kill_timeout"]
                while left() and time.monotonic() < deadline:
                    time.sleep(POLL)
    return {
        "scope": scope,
        "state": state,
        "stale": stale,
        "targets": info,
        "killed": killed,
        "survivors": left(),
        "seconds": round(time.time() - began, 3),
    }


def nvidia_apps(nvidia_smi: str) -> list[tuple[int, int | None]]:
    """``(host pid, used MiB)`` of every compute process ``nvidia-smi`` lists."""
    proc = subprocess.run(
        [nvidia_smi, "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
        capture_output=True,
        check=False,
    )
    if proc.returncode != 0:
        msg = (proc.stderr or proc.stdout).decode("utf-8", "replace").strip()
        raise RuntimeError(f"nvidia-smi exit {proc.returncode}: {msg[:200]}")
    out = []
    for line in proc.stdout.decode("utf-8", "replace").splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 2 or not parts[0].isdigit():
            continue
        mem = int(parts[1]) if parts[1].isdigit() else None
        out.append((int(parts[0]), mem))
    return out


def ns_identity(host_pid: int) -> tuple[int, int | None]:
    """(innermost-namespace pid, start time) of a host pid; (host_pid, None) if it is gone."""
    try:
        with open(f"/proc/{host_pid}/status") as f:
            for line in f:
                if line.startswith("NSpid:"):
                    inner = int(line.split()[-1])
                    break
            else:
                inner = host_pid
    except OSError:
        return host_pid, None
    st = proc_stat(host_pid)
    return inner, (st.start_time if st else None)


def op_gpu_wait(a: GpuWaitArgs) -> GpuWaitAnswer | ErrorAnswer:
    """Poll ``nvidia-smi`` until none of ``targets`` holds GPU memory, or ``timeout`` passes."""
    targets = {int(p): s for p, s in a["targets"]}
    deadline = time.monotonic() + a["timeout"]
    began = time.time()
    while True:
        try:
            apps = nvidia_apps(a.get("nvidia_smi") or "nvidia-smi")
        except (OSError, RuntimeError) as exc:
            return {"error": f"cannot read GPU memory: {exc}"}
        holders: list[GpuHolder] = []
        for host_pid, mem in apps:
            inner, start = ns_identity(host_pid)
            if inner in targets and (start is None or targets[inner] is None or start == targets[inner]):
                holders.append({"pid": inner, "host_pid": host_pid, "used_mib": mem})
        if not holders or time.monotonic() >= deadline:
            return {"holders": holders, "seconds": round(time.time() - began, 3)}
        time.sleep(0.5)


def op_clear(a: ClearArgs) -> ClearAnswer:
    """Remove the contents of each cache path (the path itself stays); count files and bytes."""
    out: list[ClearedPath] = []
    for path in a["paths"]:
        files = dirs = size = 0
        errors: list[str] = []
        if not os.path.lexists(path):
            out.append({"path": path, "missing": True, "files": 0, "bytes": 0, "errors": []})
            continue
        if os.path.isdir(path) and not os.path.islink(path):
            for root, dnames, fnames in os.walk(path, topdown=False):
                for n in fnames:
                    p = os.path.join(root, n)
                    try:
                        size += os.lstat(p).st_size
                        os.unlink(p)
                        files += 1
                    except OSError as exc:
                        errors.append(f"{p}: {exc.strerror}")
                for n in dnames:
                    p = os.path.join(root, n)
                    try:
                        if os.path.islink(p):
                            os.unlink(p)
                        else:
                            os.rmdir(p)
                        dirs += 1
                    except OSError as exc:
                        errors.append(f"{p}: {exc.strerror}")
        else:
            try:
                size += os.lstat(path).st_size
                os.unlink(path)
                files += 1
            except OSError as exc:
                errors.append(f"{path}: {exc.strerror}")
        out.append(
            {"path": path, "missing": False, "files": files, "dirs": dirs, "bytes": size, "errors": errors}
        )
    return {"cleared": out}


def op_patch(a: PatchArgs) -> PatchAnswer | ErrorAnswer:
    """Revert then apply named diffs (texts on stdin); report the patches in effect after."""
    texts = read_stdin_json()
    if texts is None:
        return {
            "error": "no patch text arrived on stdin (does the exec wrapper forward stdin? docker exec needs -i)"
        }
    workdir = a["workdir"]
    done: PatchAnswer = {"applied": [], "reverted": [], "kept": [], "failed": [], "in_effect": []}
    for name in a.get("revert", []):
        state, msg = patch_state(workdir, texts[name])
        if state == "applied":
            ok, msg = git(workdir, ["apply", "--reverse", "-"], texts[name])
            (done["reverted"] if ok else done["failed"]).append(name if ok else f"{name}: {msg}")
    for name in a.get("apply", []):
        state, msg = patch_state(workdir, texts[name])
        if state == "applied":
            done["kept"].append(name)
            continue
        ok, msg = git(workdir, ["apply", "-"], texts[name])
        (done["applied"] if ok else done["failed"]).append(name if ok else f"{name}: {msg}")
    in_effect = sorted(n for n in texts if patch_state(workdir, texts[n])[0] == "applied")
    done["in_effect"] = in_effect
    return done


def op_patches(a: PatchesArgs) -> PatchesAnswer | ErrorAnswer:
    """Which of the named diffs (texts on stdin) are applied in ``workdir`` now."""
    texts = read_stdin_json()
    if texts is None:
        return {
            "error": "no patch text arrived on stdin (does the exec wrapper forward stdin? docker exec needs -i)"
        }
    return {"applied": {n: patch_state(a["workdir"], t)[0] == "applied" for n, t in texts.items()}}


def op_launch(a: LaunchArgs) -> LaunchAnswer | ErrorAnswer:
    """Start the job detached and report its identity at once.

    The helper forks an intermediate process that leaves the helper's session (``setsid``) and
    forks the *waiter* (:data:`WAITER`, a small program of its own, titled
    ``pitstop-waiter NAME RUN_ID``; it reads ``argv`` from an unlinked file, never from its
    command line); the intermediate exits at
    once, so the waiter is nobody's child.  The waiter holds none of the SSH channel's
    descriptors (its stdin/stdout/stderr are ``/dev/null``), starts the job with
    ``Popen(start_new_session=True)`` — pid = pgid = sid — with stdin ``/dev/null`` and
    stdout/stderr appended to the log, sends the job's pid and start time back through a pipe,
    then waits for the job and writes its exit status next to the log.  The helper prints
    what it received and exits: the channel closes at once.
    """
    workdir, argv, log = a["workdir"], a["argv"], a["log"]
    logfd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    log_size = os.fstat(logfd).st_size
    rfd, wfd = os.pipe()
    child = os.fork()
    if child == 0:
        code = 0
        try:
            os.close(rfd)
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            for fd in range(3, 1024):
                if fd not in (wfd, logfd):
                    try:
                        os.close(fd)
                    except OSError:
                        pass
            os.setsid()
            if os.fork() == 0:
                os.set_inheritable(wfd, True)
                os.set_inheritable(logfd, True)
                spec = {
                    "workdir": workdir,
                    "argv": argv,
                    "status": status_path(log),
                    "wfd": wfd,
                    "logfd": logfd,
                    "name": a.get("name") or "job",
                    "run_id": a.get("run_id") or "-",
                }
                specfile = tempfile.TemporaryFile()  # unlinked: the job's argv stays off the command line
                specfile.write(json.dumps(spec).encode())
                specfile.flush()
                specfile.seek(0)
                fd = specfile.fileno()
                os.set_inheritable(fd, True)
                os.execv(sys.executable, [sys.executable, "-E", "-S", "-c", WAITER, str(fd)])
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    os.close(wfd)
    os.close(logfd)
    chunks = []
    while True:
        data = os.read(rfd, 65536)
        if not data:
            break
        chunks.append(data)
    os.close(rfd)
    try:
        os.waitpid(child, 0)
    except ChildProcessError:
        pass
    try:
        info: dict[str, Any] = json.loads(b"".join(chunks).decode() or "{}")
    except ValueError:
        info = {}
    if "pid" not in info:
        return {"error": info.get("error") or "the launcher vanished before reporting a pid"}
    return {
        "pid": info["pid"],
        "pgid": info["pgid"],
        "sid": info["sid"],
        "start_time": info["start_time"],
        "launched_at": info["launched_at"],
        "log_size": log_size,
    }


def probe_one(procs: Procs, j: JobArgs, log: str | None = None) -> JobState:
    """Processes, liveness and (given ``log``) log state of one job."""
    rx = re.compile(j["match"])
    out: JobState = {"name": j.get("name"), "error": None}
    sid, pid, start = j.get("sid"), j.get("pid"), j.get("start_time")
    if sid is not None:
        members, matching = session_view(procs, sid, rx)
    else:
        matching = user_matching(procs, rx, j.get("workdir"))
        members = matching
    out["session_pids"] = members
    out["pids"] = matching
    out["count"] = len(matching)
    if pid is not None:
        state, _now_start = identity(pid, start)
        out["state"] = state
        out["alive"] = state == "alive"
    else:
        out["state"] = None
        out["alive"] = None
    if log:
        out["log"] = file_info(log)
    return out


def ending(out: JobState, j: JobArgs, log: str, offset: int, lines: int) -> None:
    """Put in ``out`` how the job's run ended: the last ``lines`` lines of ``log`` written after
    byte ``offset`` (``tail``) and the waiter's exit record of the recorded pid (``status``)."""
    out["tail"] = tail_bytes(log, offset, lines).decode("utf-8", "replace")
    pid = j.get("pid")
    out["status"] = read_status(log, pid, j.get("start_time")) if pid else None


def probe_ending(state: JobState, j: ProbeJob, log: str, lines: int) -> None:
    """:func:`ending` of a job a probe found short of processes (from byte 0) and, when none is
    left and its waiter recorded the end at most ``crash_within`` s ago, the last ``crash_bytes``
    of its log since ``crash_from`` (``crash``, zlib-compressed)."""
    ending(state, j, log, 0, lines)
    st, since = state["status"], j.get("crash_from")
    if state["count"] == 0 and st and since is not None and time.time() - st["ended_at"] <= j["crash_within"]:
        size, most = state["log"]["size"] or 0, j["crash_bytes"]
        # from the launch on; a log truncated since (copytruncate) holds this run's only: its end
        state["crash"] = read_file(log, max(since * (since <= size), size - most), most, None, True)


def op_probe(a: ProbeArgs) -> ProbeAnswer:
    """:func:`probe_one` for several jobs of one host in one call, with each job's ``read`` (its
    metric log's new bytes, zlib-compressed; with ``if_running`` only when it has processes) and,
    for a job with fewer than ``processes`` processes, its ending (:func:`ending`, from byte 0),
    with, when none is left and its waiter recorded the end, the log since ``crash_from``."""
    procs = probe_scan(a["jobs"])
    out: dict[str, JobState] = {}
    for j in a["jobs"]:
        name = str(j.get("name"))
        try:
            state = out[name] = probe_one(procs, j, j.get("log"))
        except Exception as exc:  # one bad job (regex, permissions) must not hide the others
            out[name] = {"name": j.get("name"), "error": f"{type(exc).__name__}: {exc}"}
            continue
        log, lines = j.get("log"), j.get("tail_lines")
        if log and lines and state["count"] < j.get("processes", 1):  # dead or short: how it ended too
            try:
                probe_ending(state, j, log, lines)
            except OSError:
                pass  # the log went away meanwhile: no ending
        want = j.get("read")
        if want and (state["count"] > 0 or not want["if_running"]):
            try:
                got = read_file(want["path"], want["offset"], want["max_bytes"], want["inode"], True)
            except Exception as exc:
                got = {"error": f"{type(exc).__name__}: {exc}"}
            state["read"] = got
    return {"jobs": out, "time": time.time()}


def op_evidence(a: EvidenceArgs) -> EvidenceAnswer:
    """What verification decides from: liveness, count, log growth, errors, exit status, tail."""
    procs = scan()
    res = cast("EvidenceAnswer", probe_one(procs, a, a["log"]))  # the same keys and more, all optional
    log, offset = a["log"], a.get("offset") or 0
    res["new_bytes"] = None
    size = res["log"]["size"] if "log" in res else None
    if size is not None:
        res["new_bytes"] = size - offset if size >= offset else size
        res["error_line"] = first_error(log, offset)
    else:
        res["error_line"] = None
    ending(res, a, log, offset, a.get("tail_lines", 30))
    progress_log, checkpoint_dir = a.get("progress_log"), a.get("checkpoint_dir")
    if progress_log:
        res["start_step"] = start_step(progress_log, a.get("progress_offset") or 0)
    if checkpoint_dir:
        res["checkpoint"] = checkpoint_info(checkpoint_dir)
    res["time"] = time.time()
    return res


def op_read(a: ReadArgs) -> ReadAnswer | ErrorAnswer:
    """Log bytes from an offset (base64, zlib-compressed when ``zlib`` is set); a negative offset
    counts from the end; starts over from 0 after truncation or a new inode."""
    return read_file(a["path"], a["offset"], a["max_bytes"], a.get("inode"), bool(a.get("zlib")))


def read_file(
    path: str, offset: int, max_bytes: int, inode: int | None, packed: bool
) -> ReadAnswer | ErrorAnswer:
    """:func:`op_read`'s answer for one file (also a probe's ``read``)."""
    info = file_info(path)
    size = info["size"]
    if size is None:
        return {"error": str(info["error"])}
    if offset < 0:
        offset = max(0, size + offset)
    reset = offset > size or (inode is not None and inode != info["inode"])
    if reset:
        offset = 0
    data = read_range(path, offset, min(max_bytes, size - offset))
    return {
        "data": base64.b64encode(zlib.compress(data, 1) if packed else data).decode(),
        "zlib": packed,
        "offset": offset + len(data),
        "size": size,
        "inode": info["inode"],
        "reset": reset,
    }


def op_tail(a: TailArgs) -> TailAnswer | ErrorAnswer:
    """The last lines of a file."""
    info = file_info(a["path"])
    size = info["size"]
    if size is None:
        return {"error": str(info["error"])}
    return {
        "text": tail_bytes(a["path"], a.get("start", 0), a["lines"], a.get("max_bytes", 65536)).decode(
            "utf-8", "replace"
        ),
        "size": size,
    }


def proc_environ(pid: int) -> dict[bytes, bytes]:
    """``/proc/PID/environ`` as a dict (empty if it cannot be read)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            raw = f.read()
    except OSError:
        return {}
    return dict(kv.split(b"=", 1) for kv in raw.split(b"\0") if b"=" in kv)


def op_slurm_tasks(a: SlurmTasksArgs) -> SlurmTasksAnswer:
    """Run on one node of a Slurm job (``srun --jobid=ID --overlap``): the job's task processes here.

    A task process matches ``match`` and its environment holds ``SLURM_JOB_ID=job``, a
    ``SLURM_STEP_ID`` (set for tasks of a step, not for the batch script or its ``srun`` client)
    and this node's ``SLURMD_NODENAME``.
    """
    rx = re.compile(a["match"])
    job = str(a["job"]).encode()
    node = os.environ.get("SLURMD_NODENAME", "")
    pids: list[int] = []
    for pid, proc in scan().items():
        if not matches(rx, proc.cmdline):
            continue
        env = proc_environ(pid)
        if env.get(b"SLURM_JOB_ID") != job or b"SLURM_STEP_ID" not in env:
            continue
        if env.get(b"SLURMD_NODENAME", b"").decode() == node:
            pids.append(pid)
    return {"node": node, "pids": sorted(pids), "count": len(pids), "time": time.time()}


PY_SPY_TIMEOUT = 20  #: seconds for one ``py-spy dump``


def find_py_spy() -> str | None:
    """py-spy on PATH, next to the interpreter, or in ~/.local/bin (None if nowhere)."""
    import shutil

    for cand in (
        shutil.which("py-spy"),
        os.path.join(os.path.dirname(sys.executable), "py-spy"),
        os.path.expanduser("~/.local/bin/py-spy"),
    ):
        if cand and os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand
    return None


def op_hang(a: HangArgs) -> HangAnswer:
    """State, wchan, command line and (with py-spy) Python stacks of the job's processes (or ``pids``)."""
    procs = scan()
    pids = [int(p) for p in (a.get("pids") or probe_one(procs, a)["pids"])][: a.get("max_pids", 16)]
    spy = find_py_spy()
    out: list[HangProcess] = []
    for pid in pids:
        st = proc_stat(pid)
        try:
            with open(f"/proc/{pid}/wchan", "rb") as f:
                wchan = f.read().decode("utf-8", "replace").strip() or None
        except OSError:
            wchan = None
        item: HangProcess = {
            "pid": pid,
            "state": st.state if st else None,
            "wchan": None if wchan == "0" else wchan,
            "cmdline": proc_cmdline(pid).decode("utf-8", "replace")[:200],
            "stack": None,
            "stack_error": None,
        }
        if spy and st is not None:
            try:
                r = subprocess.run(
                    [spy, "dump", "--pid", str(pid)],
                    stdin=subprocess.DEVNULL,
                    capture_output=True,
                    timeout=PY_SPY_TIMEOUT,
                )
                text = r.stdout.decode("utf-8", "replace").strip()
                if r.returncode == 0 and text:
                    item["stack"] = text[-6000:]
                else:
                    item["stack_error"] = (r.stderr.decode("utf-8", "replace").strip() or text)[-500:]
            except subprocess.TimeoutExpired:
                item["stack_error"] = f"py-spy dump timed out after {PY_SPY_TIMEOUT}s"
        out.append(item)
    return {"processes": out, "py_spy": spy, "time": time.time()}


#: operation name → its function (arguments and answers: :data:`pipeline.host.contract.OPERATIONS`)
OPS: dict[str, Callable[[Any], Mapping[str, object]]] = {
    "slurm_tasks": op_slurm_tasks,
    "preflight": op_preflight,
    "stop": op_stop,
    "gpu_wait": op_gpu_wait,
    "clear": op_clear,
    "patch": op_patch,
    "patches": op_patches,
    "launch": op_launch,
    "probe": op_probe,
    "evidence": op_evidence,
    "read": op_read,
    "tail": op_tail,
    "hang": op_hang,
}


def main(argv: list[str]) -> int:
    """Run ``OP`` with its JSON arguments; print one JSON object."""
    if len(argv) != 3 or argv[1] not in OPS:
        sys.stdout.write(
            json.dumps({"error": "usage: helper OP JSON (ops: {})".format(", ".join(sorted(OPS)))})
        )
        return 3
    try:
        result = OPS[argv[1]](json.loads(argv[2]))
    except Exception as exc:
        sys.stdout.write(json.dumps({"error": f"{type(exc).__name__}: {exc}"}))
        return 3
    sys.stdout.write(json.dumps(result))
    sys.stdout.flush()
    return 3 if isinstance(result, dict) and result.get("error") else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
