# pitstop-host-helper (the protocol and its version: pipeline/host/contract.py)
"""Pitstop's helper on the GPU host: one program, standard library only (Python 3.8+).

Run as ``python3 -c SOURCE OP`` (behind the job's ``exec`` wrapper) with its JSON arguments on
stdin's first line (then any larger input, such as diffs: nothing of them shows in ``ps`` and no
size bounds them), it prints one JSON object and exits 0, or ``{"error": "..."}`` with status 3.
It reads ``/proc`` itself and looks only at its user's processes, minus its own ancestry and
any copy of the helper (the marker on its first line), so it never counts or signals itself.
The operations (``OPS``) and their arguments and answers are typed in
:mod:`pipeline.host.contract`, its one Pitstop import, which
:func:`pipeline.host.probe.helper_source` ships inside the helper's source instead.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zlib
from typing import TYPE_CHECKING, Any, cast

from pipeline.host.contract import *  # shipped inline in its place (helper_source)

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    Procs = dict[int, ProcStat]

MARK = MARKER.encode()

#: The waiter (:func:`op_launch`): its spec comes in an unlinked file on descriptor ``argv[1]`` and it
#: retitles itself ``pitstop-waiter JOB RUN_ID``: one matching the job's pattern sees trainers only.
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
    """:class:`~pipeline.host.contract.ProcStat` of ``pid``, or None if it is gone (fields are
    split after the last ``)``: the comm field may hold spaces and parentheses)."""
    data = proc_file(pid, "stat")
    if not data:
        return None
    rest = data[data.rindex(b")") + 2 :].split()
    return ProcStat(rest[0].decode(), int(rest[1]), int(rest[2]), int(rest[3]), int(rest[19]))


def proc_cmdline(pid: int) -> bytes:
    """``/proc/PID/cmdline`` with NULs read as spaces, trailing space stripped ('' if gone)."""
    return proc_file(pid, "cmdline").replace(b"\0", b" ").rstrip(b" ")


def proc_file(pid: int, name: str) -> bytes:
    """``/proc/PID/NAME`` ('' if it cannot be read)."""
    try:
        with open(f"/proc/{pid}/{name}", "rb") as f:
            return f.read()
    except OSError:
        return b""


def ancestry() -> set[int]:
    """The helper's own pid and every parent up to pid 1."""
    out: set[int] = set()
    pid = os.getpid()
    while pid > 0 and pid not in out:
        out.add(pid)
        st = proc_stat(pid)
        pid = st.ppid if st else 0
    return out


def scan(sessions: set[int | None] | None = None, keep: Callable[[bytes], bool] | None = None) -> Procs:
    """Live processes of the helper's user, minus its ancestry and other helpers: pid →
    :class:`~pipeline.host.contract.ProcStat` with its ``cmdline``.  Only members of ``sessions`` /
    only command lines ``keep`` accepts, when given: the others cost one ``stat`` each instead of
    two reads.
    """
    me = os.getuid()
    skip = ancestry()
    out: Procs = {}
    waiter = WAITER_TITLE.encode() + b" "
    for pid in [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]:
        try:
            if pid in skip or os.stat(f"/proc/{pid}").st_uid != me:
                continue
        except OSError:
            continue
        if keep is not None and not keep(proc_cmdline(pid)):
            continue
        st = proc_stat(pid)
        if st is None or st.state in ("Z", "X") or (sessions is not None and st.session not in sessions):
            continue
        cmd = proc_cmdline(pid)  # read again for those ``keep`` took: a few
        if MARK not in cmd and not cmd.startswith(waiter):
            out[pid] = st._replace(cmdline=cmd)
    return out


def probe_scan(jobs: list[ProbeJob]) -> Procs:
    """:func:`scan` narrowed to what ``jobs`` can count: their recorded sessions when every job has
    one, the command lines one of their ``match`` patterns finds when none has; else everything."""
    sids = {j.get("sid") for j in jobs}
    if jobs and None not in sids:
        return scan(sessions=sids)
    if jobs and sids == {None}:
        rxs = []
        for j in jobs:
            try:
                rxs.append(re.compile(j["match"]))
            except re.error:
                pass  # reported by probe_one for that job alone
        return scan(keep=lambda cmd: any(matches(rx, cmd) for rx in rxs))
    return scan()


def matches(rx: re.Pattern[str], cmd: bytes) -> bool:
    """True if ``rx`` is found in the command line (read as UTF-8)."""
    return rx.search(cmd.decode(errors="replace")) is not None


def identity(pid: int, start_time: int | None) -> tuple[str, int | None]:
    """'alive', 'gone' or 'stale' (the pid now belongs to a process with another start time)."""
    st = proc_stat(pid)
    if st is None or st.state in ("Z", "X"):
        return "gone", None
    if start_time is not None and st.start_time != start_time:
        return "stale", st.start_time
    return "alive", st.start_time


def in_workdir(pid: int, workdir: str | None) -> bool:
    """True if ``workdir`` is None, or the process's working directory lies inside it."""
    try:
        cwd = os.readlink(f"/proc/{pid}/cwd") if workdir else ""
    except OSError:
        return False
    return not workdir or (cwd.rstrip("/") + "/").startswith(os.path.realpath(workdir).rstrip("/") + "/")


def user_matching(procs: Procs, rx: re.Pattern[str], workdir: str | None = None) -> list[int]:
    """The user's processes whose command line matches ``rx`` and that run inside ``workdir`` (a
    job's processes without a recorded session; ``workdir`` keeps another checkout's copies out)."""
    return sorted(p for p, v in procs.items() if matches(rx, v.cmdline) and in_workdir(p, workdir))


def descendants(procs: Procs, roots: list[int]) -> set[int]:
    """``roots`` and every process below them (by parent pid)."""
    out = set(roots)
    while more := {p for p, v in procs.items() if v.ppid in out} - out:
        out |= more
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


def read_since(path: str, start: int, max_bytes: int, last: bool = True) -> tuple[bytes, bool] | None:
    """The ``last`` (else first) ``max_bytes`` of what ``path`` holds from byte ``start`` (from 0
    when it is shorter now: truncated), and whether bytes after ``start`` were left before them;
    None if it cannot be read."""
    try:
        size = os.stat(path).st_size
    except OSError:
        return None
    start = start if size >= start else 0
    begin = max(start, size - max_bytes) if last else start
    return read_range(path, begin, min(max_bytes, size - begin)), begin > start


def tail_bytes(path: str, start: int, lines: int) -> bytes:
    """The last ``lines`` lines of ``path`` written at or after byte ``start`` (of its last 64 KiB)."""
    data, cut = read_since(path, start, 65536) or (b"", False)
    if cut and b"\n" in data:
        data = data[data.index(b"\n") + 1 :]
    return b"\n".join(data.splitlines()[-lines:]) if lines > 0 else b""


def first_error(path: str, start: int, max_bytes: int = 1 << 20) -> str | None:
    """The first line holding a traceback / ``…Error`` / ``Killed`` written after ``start``."""
    data = (read_since(path, start, max_bytes) or (b"", False))[0]
    m = ERROR_RX.search(data)
    if m is None:
        return None
    end = data.find(b"\n", m.end())
    line = data[data.rfind(b"\n", 0, m.start()) + 1 : end if end >= 0 else len(data)]
    return line.decode("utf-8", "replace").strip()[:300]


#: with ``step``, a JSON line without ``role`` is a metric line (``pipeline/observe/metrics.py``)
METRIC_KEYS = ("tokens_per_s", "samples_per_s", "loss")
RESUME_RX = re.compile(rb"\bresume_step=(\d+)|\bresum(?:ed|ing) (?:at|from) step (\d+)", re.IGNORECASE)


def start_step(path: str, start: int, max_bytes: int = 1 << 20) -> StartStep:
    """Where a run started, from the first bytes it wrote after ``start``.

    ``said``: the step a ``resume_step=N`` / ``resumed at step N`` line names; ``first``: the
    largest first ``step`` among the ranks' JSON metric lines (a ``role``, or one of
    :data:`METRIC_KEYS`), minus one (a rank that resumed
    from N logs N+1 first; one that started afresh logs 1).  None each when not found.
    """
    data = (read_since(path, start, max_bytes, last=False) or (b"", False))[0]  # unreadable: None each
    m = RESUME_RX.search(data)
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
            and ("role" in rec or any(k in rec for k in METRIC_KEYS))
            and "event" not in rec
            and isinstance(rec.get("step"), int)
        ):
            firsts.setdefault(rec.get("rank"), rec["step"])
    first = max(max(firsts.values()) - 1, 0) if firsts else None
    return {"said": int(m.group(1) or m.group(2)) if m else None, "first": first}


STEP_DIR_RX = re.compile(r"^step-(\d{6,})$")


def sha256_of(path: str) -> str:
    """The file's SHA-256, hex."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def checkpoint_entry(path: str, step: int, hashes: bool) -> CheckpointEntry:
    """``path`` (a ``step-NNNNNN`` directory) checked against its ``manifest.json``: each file there
    with its size (and, with ``hashes``, its SHA-256)."""
    out: CheckpointEntry = {
        "step": step,
        "path": path,
        "time": None,
        "files": 0,
        "bytes": 0,
        "damage": None,
        "verified": None,
    }
    try:
        with open(os.path.join(path, "manifest.json"), "rb") as f:
            manifest = json.loads(f.read().decode("utf-8", "replace"))
        files = [(str(e["name"]), int(e["size"]), str(e["sha256"])) for e in manifest["files"]]
        out["time"] = float(manifest.get("time") or os.stat(path).st_mtime)
        out["files"], out["bytes"] = len(files), sum(size for _, size, _ in files)
    except (OSError, ValueError, KeyError, TypeError):
        out["damage"] = {"why": "manifest", "file": None, "size": None, "expected": None}
        return out
    for name, size, digest in files:
        try:
            have = os.stat(os.path.join(path, name)).st_size  # type: int | None
        except OSError:
            have = None
        why = "missing" if have is None else "size" if have != size else None
        if why is None and hashes and sha256_of(os.path.join(path, name)) != digest:
            why = "sha256"
        if why:
            out["damage"] = {"why": why, "file": name, "size": have, "expected": size}
            return out
    out["verified"] = "sha256" if hashes else "size"
    return out


def checkpoint_dirs(directory: str) -> list[tuple[int, str]]:
    """(step, path) of each ``step-NNNNNN`` directory in ``directory``, newest step first."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    found = [(int(m.group(1)), os.path.join(directory, n)) for n in names if (m := STEP_DIR_RX.match(n))]
    return sorted(found, reverse=True)


def op_checkpoints(a: CheckpointsArgs) -> CheckpointsAnswer:
    """Every ``step-NNNNNN`` checkpoint in ``dir``, newest first, each checked against its manifest;
    with ``sha256`` the files of ``step`` are hashed too, else of each newest one down to the first intact."""
    out: list[CheckpointEntry] = []
    hashing = a["sha256"]
    for step, path in checkpoint_dirs(a["dir"]):
        want = a.get("step")
        entry = checkpoint_entry(path, step, hashing and want in (None, step))
        hashing = hashing and (want is not None or entry["damage"] is not None)
        out.append(entry)
    return {"checkpoints": out, "time": time.time()}


def checkpoint_info(directory: str) -> Checkpoint | None:
    """The newest checkpoint in ``directory``, or None if there is none.

    The newest ``step-NNNNNN`` directory whose manifest matches its files' sizes decides (its
    manifest dates it); else ``latest.json`` (``{"step": N}``) when present; else the newest file,
    its step the last number in its name (``step_12000.pt``; None without one).
    """
    for step, path in checkpoint_dirs(directory):
        entry = checkpoint_entry(path, step, False)
        if entry["damage"] is None:
            manifest = os.path.join(path, "manifest.json")
            return {"step": step, "mtime": os.stat(manifest).st_mtime, "file": manifest}
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


# --- operations -------------------------------------------------------------------------------

NO_STDIN = "no %s arrived on stdin (does the exec wrapper forward stdin? docker exec needs -i)"
USAGE = "usage: helper OP <JSON (ops: %s; docker exec needs -i)"


def git(workdir: str, args: list[str], text: str) -> tuple[bool, str]:
    """Run ``git ARGS`` in ``workdir`` with ``text`` on stdin: (succeeded, first output)."""
    proc = subprocess.run(["git", *args], cwd=workdir, input=text.encode(), capture_output=True, check=False)
    return proc.returncode == 0, (proc.stderr or proc.stdout).decode("utf-8", "replace").strip()


def patch_state(workdir: str, text: str) -> tuple[str, str]:
    """'applied', 'applicable' or 'conflict' (with git's message)."""
    if git(workdir, ["apply", "--reverse", "--check", "-"], text)[0]:
        return "applied", ""
    ok, msg = git(workdir, ["apply", "--check", "-"], text)
    if ok:
        return "applicable", ""
    return "conflict", msg.splitlines()[0] if msg else "does not apply"


def read_stdin_json() -> Any:
    """The JSON document on stdin after the arguments' line, or None if there is none."""
    data = sys.stdin.read()
    return json.loads(data) if data.strip() else None


def executable(path: str) -> bool:
    """Whether ``path`` is a file this user may execute."""
    return os.path.isfile(path) and os.access(path, os.X_OK)


def op_preflight(a: PreflightArgs) -> PreflightAnswer:
    """All pre-flight checks in one go; nothing is changed."""
    checks: list[PreflightCheck] = []

    def check(name: str, ok: bool, why: str = "") -> bool:
        checks.append({"check": name, "ok": bool(ok), "detail": "" if ok else why})
        return ok

    workdir, log = a["workdir"], a["log"]
    if check("workdir", os.path.isdir(workdir), f"{workdir}: no such directory"):
        prog = a["program"]
        if "/" in prog:
            path = prog if prog.startswith("/") else os.path.normpath(os.path.join(workdir, prog))
            check("launch", executable(path), f"{path}: not an executable file")
        else:
            check("launch", shutil.which(prog) is not None, f"{prog}: not found on PATH")
    logdir = os.path.dirname(log) or "/"
    if not os.path.isdir(logdir):
        check("log_dir", False, f"{logdir}: no such directory")
    elif not os.access(logdir, os.W_OK | os.X_OK) or (os.path.exists(log) and not os.access(log, os.W_OK)):
        check("log_dir", False, f"{log if os.path.exists(log) else logdir}: not writable")
    else:
        check("log_dir", True)
        st = os.statvfs(logdir)
        free = st.f_bavail * st.f_frsize
        need = f"{free // 10**6} MB free in {logdir} (need {a['min_free'] // 10**6} MB)"
        checks.append({"check": "disk", "ok": free >= a["min_free"], "detail": need})
    applied: dict[str, bool] = {}
    wants = a.get("patches") or {}
    texts = read_stdin_json() if wants else {}
    if texts is None:
        check("patch", False, NO_STDIN % "patch text")
    elif os.path.isdir(workdir):
        for name in sorted(wants):
            state, msg = patch_state(workdir, texts[name])
            applied[name] = state == "applied"
            how = {"apply": "does not apply", "revert": "cannot be reverted"}.get(wants[name])
            if state == "conflict" and how:
                check("patch", False, f"{name} {how}: {msg}")
    r = a.get("running")
    running = probe_one(scan(), r, r.get("log")) if r else None
    return {"checks": checks, "applied": applied, "running": running}


def op_stop(a: StopArgs) -> StopAnswer:
    """Stop the job: SIGTERM to its recorded session's process groups (else to the processes
    ``match`` finds inside ``workdir``, and theirs), SIGKILL to what is left after
    ``term_timeout`` s and to what joined the session meanwhile, then confirm nothing is left.
    Never signals a recorded pid whose start time differs (``stale``), nor its session."""
    pid, start, sid = a.get("pid"), a.get("start_time"), a.get("sid")
    began = time.time()
    procs = scan()
    state, now_start = identity(pid, start) if pid is not None else (None, None)
    stale: StaleRecord | None = None
    if state == "stale" and pid is not None:
        stale = {"pid": pid, "recorded": start, "found": now_start}
    if sid is not None and stale is None:
        targets = {p: v for p, v in procs.items() if v.session == sid}
        scope = "session"
    else:
        roots = user_matching(procs, re.compile(a["match"]), a.get("workdir"))
        if stale is not None:
            roots = [p for p in roots if p != pid and procs[p].session != pid]
        targets = {p: procs[p] for p in descendants(procs, roots)}
        scope = "match"
    ident: dict[int, int | None] = {p: v.start_time for p, v in targets.items()}
    info: list[StopTarget] = [
        {"pid": p, "start_time": v.start_time, "cmdline": v.cmdline.decode("utf-8", "replace")[:200]}
        for p, v in sorted(targets.items())
    ]

    def left() -> list[int]:
        return sorted(p for p, st in ident.items() if identity(p, st)[0] == "alive")

    def send(sig: int, pids: list[int], timeout: float) -> None:
        """``sig`` to ``pids`` still of the same start time (to their process groups in the session
        scope), then wait up to ``timeout`` s for them to end."""
        kills: set[tuple[Callable[[int, int], None], int]] = set()
        for p in pids:
            st = proc_stat(p)
            if st is not None and st.start_time == ident[p]:
                kills.add((os.killpg, st.pgrp) if scope == "session" and st.session == sid else (os.kill, p))
        for kill, target in kills:
            try:
                kill(target, sig)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + timeout
        while left() and time.monotonic() < deadline:
            time.sleep(POLL)

    killed: list[int] = []
    if targets:
        send(signal.SIGTERM, list(targets), a["term_timeout"])
        killed = left()
        if killed:
            send(signal.SIGKILL, killed, a["kill_timeout"])
        if scope == "session":  # anything that joined the session meanwhile
            late = {p: v.start_time for p, v in scan().items() if v.session == sid and p not in ident}
            ident.update(late)
            if late:
                send(signal.SIGKILL, list(late), a["kill_timeout"])
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
    rows = [[*line.replace(" ", "").split(","), ""] for line in proc.stdout.decode().splitlines()]
    return [(int(r[0]), int(r[1]) if r[1].isdigit() else None) for r in rows if r[0].isdigit()]


def ns_identity(host_pid: int) -> tuple[int, int | None]:
    """(innermost-namespace pid, start time) of a host pid; (host_pid, None) if it is gone."""
    nspid = [
        line.split() for line in proc_file(host_pid, "status").splitlines() if line.startswith(b"NSpid:")
    ]
    st = proc_stat(host_pid)
    return (int(nspid[0][-1]) if nspid else host_pid), (st.start_time if st else None)


def op_gpu_wait(a: GpuWaitArgs) -> GpuWaitAnswer | ErrorAnswer:
    """Poll ``nvidia-smi`` until none of ``targets`` holds GPU memory, or ``timeout`` passes
    (host pids mapped through ``NSpid`` for containers)."""
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


def remove(path: str, entry: ClearedPath, directory: bool = False) -> None:
    """Remove a file (counted in ``files`` and ``bytes``) or an emptied directory (``dirs``; a link
    to one is unlinked); an error goes to ``errors``."""
    try:
        if directory:
            (os.unlink if os.path.islink(path) else os.rmdir)(path)
            entry["dirs"] += 1
        else:
            entry["bytes"] += os.lstat(path).st_size
            os.unlink(path)
            entry["files"] += 1
    except OSError as exc:
        entry["errors"].append(f"{path}: {exc.strerror}")


def op_clear(a: ClearArgs) -> ClearAnswer:
    """Remove the contents of each cache path (the path itself stays); count files and bytes."""
    out: list[ClearedPath] = []
    for path in a["paths"]:
        entry = ClearedPath(path=path, missing=not os.path.lexists(path), errors=[], files=0, bytes=0, dirs=0)
        out.append(entry)
        if os.path.isdir(path) and not os.path.islink(path):
            for root, dnames, fnames in os.walk(path, topdown=False):
                for name in fnames:
                    remove(os.path.join(root, name), entry)
                for name in dnames:
                    remove(os.path.join(root, name), entry, directory=True)
        elif not entry["missing"]:
            remove(path, entry)
    return {"cleared": out}


def op_patch(a: PatchArgs) -> PatchAnswer | ErrorAnswer:
    """Revert then apply named diffs (texts on stdin); report the patches in effect after."""
    texts = read_stdin_json()
    if texts is None:
        return {"error": NO_STDIN % "patch text"}
    workdir = a["workdir"]
    done: PatchAnswer = {"applied": [], "reverted": [], "kept": [], "failed": [], "in_effect": []}
    for name in a.get("revert", []):
        if patch_state(workdir, texts[name])[0] == "applied":
            ok, msg = git(workdir, ["apply", "--reverse", "-"], texts[name])
            (done["reverted"] if ok else done["failed"]).append(name if ok else f"{name}: {msg}")
    for name in a.get("apply", []):
        if patch_state(workdir, texts[name])[0] == "applied":
            done["kept"].append(name)
            continue
        ok, msg = git(workdir, ["apply", "-"], texts[name])
        (done["applied"] if ok else done["failed"]).append(name if ok else f"{name}: {msg}")
    done["in_effect"] = sorted(n for n in texts if patch_state(workdir, texts[n])[0] == "applied")
    return done


def op_patches(a: PatchesArgs) -> PatchesAnswer | ErrorAnswer:
    """Which of the named diffs (texts on stdin) are applied in ``workdir`` now."""
    texts = read_stdin_json()
    if texts is None:
        return {"error": NO_STDIN % "patch text"}
    return {"applied": {n: patch_state(a["workdir"], t)[0] == "applied" for n, t in texts.items()}}


def op_launch(a: LaunchArgs) -> LaunchAnswer | ErrorAnswer:
    """Start the job detached and report its identity at once: an intermediate child leaves the
    helper's session, forks the waiter (:data:`WAITER`; nobody's child, none of the SSH channel's
    descriptors) and exits.  The job runs in a session of its own (pid = pgid = sid), stdin
    ``/dev/null``, output appended to the log; its exit status lands in :func:`status_path`."""
    workdir, argv, log = a["workdir"], a["argv"], a["log"]
    logfd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    log_size = os.fstat(logfd).st_size
    rfd, wfd = os.pipe()
    child = os.fork()
    if child == 0:  # the intermediate child, and a waiter that failed to start, end at its os._exit
        try:
            os.close(rfd)
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            low = 3
            for fd in sorted((wfd, logfd)):
                os.closerange(low, fd)
                low = fd + 1
            os.closerange(low, 1024)
            os.setsid()
            if os.fork() == 0:
                spec = {
                    "workdir": workdir,
                    "argv": argv,
                    "status": status_path(log),
                    "wfd": wfd,
                    "logfd": logfd,
                }
                spec.update(name=a.get("name") or "job", run_id=a.get("run_id") or "-")
                specfile = tempfile.TemporaryFile()  # unlinked: the job's argv stays off the command line
                specfile.write(json.dumps(spec).encode())
                specfile.flush()
                specfile.seek(0)
                for fd in (wfd, logfd, specfile.fileno()):
                    os.set_inheritable(fd, True)
                os.execv(sys.executable, [sys.executable, "-E", "-S", "-c", WAITER, str(specfile.fileno())])
        finally:
            os._exit(0)  # nobody reads the status
    os.close(wfd)
    os.close(logfd)
    with os.fdopen(rfd, "rb") as pipe:
        raw = pipe.read()
    try:
        os.waitpid(child, 0)
    except ChildProcessError:
        pass
    try:
        info: dict[str, Any] = json.loads(raw.decode() or "{}")
    except ValueError:
        info = {}
    if "pid" not in info:
        return {"error": info.get("error") or "the launcher vanished before reporting a pid"}
    return cast("LaunchAnswer", {**info, "log_size": log_size})  # pid, pgid, sid, start_time, launched_at


def probe_one(procs: Procs, j: JobArgs, log: str | None = None) -> JobState:
    """Processes, liveness and (given ``log``) log state of one job."""
    rx = re.compile(j["match"])
    sid, pid = j.get("sid"), j.get("pid")
    if sid is not None:
        members = sorted(p for p, v in procs.items() if v.session == sid)
        matching = [p for p in members if matches(rx, procs[p].cmdline)]
    else:
        members = matching = user_matching(procs, rx, j.get("workdir"))
    state = identity(pid, j.get("start_time"))[0] if pid is not None else None
    out: JobState = {
        "name": j.get("name"),
        "session_pids": members,
        "pids": matching,
        "count": len(matching),
        "state": state,
        "alive": None if state is None else state == "alive",
    }
    if log:
        out["log"] = file_info(log)
    return out


def ending(out: JobState, j: JobArgs, log: str, offset: int, lines: int) -> None:
    """Put in ``out`` how the job's run ended: the last ``lines`` lines of ``log`` written after
    byte ``offset`` (``tail``) and the waiter's exit record of the recorded pid (``status``)."""
    out["tail"] = tail_bytes(log, offset, lines).decode(errors="replace")
    try:
        with open(status_path(log)) as f:
            st: ExitRecord | None = json.load(f)
    except (OSError, ValueError):
        st = None
    pid, start = j.get("pid"), j.get("start_time")
    mine = st and pid and st.get("pid") == pid and start in (None, st.get("start_time"))
    out["status"] = st if mine else None


def probe_ending(state: JobState, j: ProbeJob, log: str, lines: int) -> None:
    """:func:`ending` of a job a probe found short of processes (from byte 0) and, when none is
    left and its waiter recorded the end at most ``crash_within`` s ago, the last ``crash_bytes``
    of its log since ``crash_from`` (``crash``, zlib-compressed)."""
    ending(state, j, log, 0, lines)
    st, since = state["status"], j.get("crash_from")
    if state["count"] == 0 and st and since is not None and time.time() - st["ended_at"] <= j["crash_within"]:
        size, most = state["log"]["size"] or 0, j["crash_bytes"]
        # from the launch on; a log truncated since (copytruncate) holds this run's only: its end
        start = max(since * (since <= size), size - most)
        state["crash"] = op_read({"path": log, "offset": start, "max_bytes": most}, True)


def op_probe(a: ProbeArgs) -> ProbeAnswer:
    """:func:`probe_one` for several jobs of one host in one call, with each job's ``read`` (with
    ``if_running`` only when it has processes) and, with fewer than ``processes``, :func:`probe_ending`."""
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
                state["read"] = op_read(want, True)
            except Exception as exc:
                state["read"] = {"error": f"{type(exc).__name__}: {exc}"}
    return {"jobs": out, "time": time.time()}


def op_evidence(a: EvidenceArgs) -> EvidenceAnswer:
    """What verification decides from: liveness, count, log growth, errors, exit status, tail."""
    res = cast("EvidenceAnswer", probe_one(scan(), a, a["log"]))  # the same keys and more, all optional
    log, offset = a["log"], a.get("offset") or 0
    size = res["log"]["size"] if "log" in res else None
    res["new_bytes"] = None if size is None else size - offset if size >= offset else size
    res["error_line"] = None if size is None else first_error(log, offset)
    ending(res, a, log, offset, a.get("tail_lines", 30))
    progress_log, checkpoint_dir = a.get("progress_log"), a.get("checkpoint_dir")
    if progress_log:
        res["start_step"] = start_step(progress_log, a.get("progress_offset") or 0)
    if checkpoint_dir:
        res["checkpoint"] = checkpoint_info(checkpoint_dir)
    res["time"] = time.time()
    return res


def op_read(a: ReadArgs, packed: bool = False) -> ReadAnswer | ErrorAnswer:
    """Log bytes from an offset (base64, zlib-compressed when ``zlib`` is set or ``packed``); a
    negative offset counts from the end; starts over from 0 after truncation or a new inode."""
    info = file_info(a["path"])
    size, packed = info["size"], packed or a.get("zlib", False)
    if size is None:
        return {"error": str(info["error"])}
    offset = max(0, a["offset"] + size * (a["offset"] < 0))
    reset = offset > size or a.get("inode") not in (None, info["inode"])
    if reset:
        offset = 0
    data = read_range(a["path"], offset, min(a["max_bytes"], size - offset))
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
    if info["size"] is None:
        return {"error": str(info["error"])}
    text = tail_bytes(a["path"], 0, a["lines"])
    return {"text": text.decode("utf-8", "replace"), "size": info["size"]}


def op_slurm_tasks(a: SlurmTasksArgs) -> SlurmTasksAnswer:
    """Run on one node of a Slurm job (``srun --overlap``): its task processes here, those matching
    ``match`` whose environment holds ``SLURM_JOB_ID=job``, a ``SLURM_STEP_ID`` (not the batch
    script nor its ``srun``) and this node's ``SLURMD_NODENAME``."""
    rx = re.compile(a["match"])
    job = str(a["job"]).encode()
    node = os.environ.get("SLURMD_NODENAME", "")
    pids: list[int] = []
    for pid, proc in scan().items():
        environ = proc_file(pid, "environ") if matches(rx, proc.cmdline) else b""
        env = dict(kv.split(b"=", 1) for kv in environ.split(b"\0") if b"=" in kv)
        if env.get(b"SLURM_JOB_ID") == job and b"SLURM_STEP_ID" in env:
            if env.get(b"SLURMD_NODENAME", b"").decode() == node:
                pids.append(pid)
    return {"node": node, "pids": sorted(pids), "count": len(pids), "time": time.time()}


PY_SPY_TIMEOUT = 20  #: seconds for one ``py-spy dump``


def op_hang(a: HangArgs) -> HangAnswer:
    """State, wchan, command line and (with py-spy) Python stacks of the job's processes (or ``pids``)."""
    pids = [int(p) for p in (a.get("pids") or probe_one(scan(), a)["pids"])][:16]
    here = os.path.join(os.path.dirname(sys.executable), "py-spy")  # else on PATH or in ~/.local/bin
    where = (shutil.which("py-spy"), here, os.path.expanduser("~/.local/bin/py-spy"))
    spy = next((path for path in where if path and executable(path)), None)
    out: list[HangProcess] = []
    for pid in pids:
        st = proc_stat(pid)
        wchan = proc_file(pid, "wchan").decode("utf-8", "replace").strip() or None
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


#: the kernel lines a crash is classified by: the OOM killer's, and NVIDIA's Xid (a GPU error)
OOM_RX = re.compile(r"oom-kill|out of memory|oom_reaper|NVRM: Xid", re.IGNORECASE)


def op_kernel_oom(a: KernelOomArgs) -> KernelOomAnswer:
    """The kernel's OOM-killer and NVIDIA Xid lines from ``dmesg`` (the newest ``lines``), or why it
    cannot be read."""
    path = os.environ.get("PATH", "") + ":/bin:/usr/bin:/sbin"  # a login shell's PATH may lack it
    out: KernelOomAnswer = {"lines": None, "unreadable": None, "time": time.time()}
    try:
        env = {**os.environ, "PATH": path}
        r = subprocess.run(["dmesg"], stdin=subprocess.DEVNULL, capture_output=True, timeout=10, env=env)
        lines = r.stdout.decode("utf-8", "replace").splitlines()
        why = r.stderr.decode("utf-8", "replace").strip().splitlines() or [f"dmesg exited {r.returncode}"]
        out["unreadable"] = why[-1][:300] if r.returncode else None
    except (OSError, subprocess.TimeoutExpired) as exc:
        lines, out["unreadable"] = [], f"dmesg: {exc}"
    if not out["unreadable"]:
        out["lines"] = [ln.strip()[:500] for ln in lines if OOM_RX.search(ln)][-max(1, a["lines"]) :]
    return out


#: operation name → its function (arguments and answers: :class:`pipeline.host.probe.Ops`)
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
    "kernel_oom": op_kernel_oom,
    "checkpoints": op_checkpoints,
}


def main(argv: list[str]) -> int:
    """Run ``OP`` with the JSON arguments on stdin's first line; print one JSON object (exit
    status 3 with ``error``: also when ``OP`` is unknown or stdin brings no arguments)."""
    result: Mapping[str, object]
    try:
        op, line = OPS.get(argv[-1]), sys.stdin.readline()
        result = op(json.loads(line)) if op and line.strip() else {"error": USAGE % ", ".join(OPS)}
    except Exception as exc:
        result = {"error": f"{type(exc).__name__}: {exc}"}
    sys.stdout.write(json.dumps(result))
    sys.stdout.flush()
    return 3 if result.get("error") else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
