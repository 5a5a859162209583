"""Ready for a GPU: the reference pipeline's ``full`` profile on this machine's GPUs for a bounded
time, a restart from its checkpoint with the GPU memory released after each stop, and the top-k
benchmark on CUDA — ONE summary line starting ``gpu-check:`` (``make gpu-check``).

Without CUDA (``torch.cuda.is_available()`` is False) it prints ``gpu-check: no GPU (…)`` and
exits 0, so it runs as is in ``make test`` (the smoke of every ``bench/*.py``) and on a lent GPU
machine alike.  With CUDA:

1. **run**: ``pipeline/dflash/run.sh --profile full`` in a session of its own, on the GPUs there
   are (eight: targets ``0-4``, drafters ``5-7``; fewer: the five targets round-robin over them and
   up to three drafters on distinct GPUs — NCCL takes one rank per GPU) for ``--seconds`` (default
   120) from its first drafter metric line (at most :data:`START_WITHIN_S` to get there), then
   SIGTERM to its process group; the drafters' pipeline tokens/s, step time and top-k
   accuracy are read from its metric lines (:mod:`pipeline.digest.stats`, the digest's own numbers);
2. **release**: after the stop, no process of the session is left, none of its PIDs holds GPU
   memory (``nvidia-smi --query-compute-apps``), and every GPU's ``memory.used`` is back within
   :data:`RELEASE_SLACK_MIB` of what it was before the launch (``torch.cuda.mem_get_info`` in a
   child process where there is no ``nvidia-smi``), within :data:`RELEASE_WITHIN_S`;
3. **restart**: the same again for half the time (at least 30 s) from the checkpoint the stop
   wrote: its banner must say ``resume_step=N`` with N > 0, it must write metric lines, and
   release again;
4. **topk**: ``bench/topk.py`` (CPU and CUDA), its summary line quoted.

Exits 1 when a check failed (the summary names it).  ``--quick`` (the smoke ``make test`` runs):
the same sequence with the ``tiny`` profile for :data:`QUICK_S` s a run, no top-k benchmark.
``--cpu``: a dry run of steps 1 and 3 on the CPU with the ``tiny`` profile (no GPU memory, no
top-k), to try the sequence on a machine without a GPU.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from benchlib import Checks

ROOT = Path(__file__).resolve().parents[1]
RUN_SH = ROOT / "pipeline" / "dflash" / "run.sh"
QUICK_S = 5.0  #: ``--quick``: seconds of each run of the tiny profile (the smoke in ``make test``)
START_WITHIN_S = 300.0  #: seconds for the first drafter metric line (model init, CUDA start-up)
STOP_WITHIN_S = 90.0  #: the launcher's own stop grace (60 s) plus the checkpoint write
RELEASE_WITHIN_S = 30.0  #: seconds after the stop for the GPU memory to be released
RELEASE_SLACK_MIB = 512.0  #: per GPU, memory.used over the baseline still counted as released


def no_gpu() -> str | None:
    """Why there is no GPU to check (torch without CUDA, no device), or None when there is one."""
    try:
        import torch
    except ImportError as exc:
        return f"torch not importable: {exc}"
    if not torch.cuda.is_available():
        return "torch.cuda.is_available() is False"
    return None


def gpu_memory(count: int) -> dict[int, float]:
    """memory.used per GPU index, MiB (nvidia-smi; else ``torch.cuda.mem_get_info`` in a child process)."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
        return {int(i): float(m) for i, m in (line.split(",") for line in out.splitlines() if "," in line)}
    except (OSError, subprocess.SubprocessError, ValueError):
        code = (
            "import torch\n"
            f"for i in range({count}):\n"
            "    free, total = torch.cuda.mem_get_info(i)\n"
            "    print(i, (total - free) / 2**20)\n"
        )
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120).stdout
        return {int(i): float(m) for i, m in (line.split() for line in out.splitlines())}


def gpu_pids() -> set[int] | None:
    """PIDs holding GPU memory (nvidia-smi), or None without nvidia-smi."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return {int(p) for p in out.split() if p.isdigit()}


def session_pids(sid: int) -> set[int]:
    """Live processes of session ``sid`` (field 6 of ``/proc/PID/stat``)."""
    out = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) == sid and fields[0] != "Z":
                out.add(int(entry))
    return out


def layout(count: int) -> tuple[str, str]:
    """``--target-devices`` and ``--drafter-devices`` for ``count`` GPUs."""
    if count >= 8:
        return "0,1,2,3,4", "5,6,7"
    drafters = list(range(count))[-min(3, count) :]
    return ",".join(str(i % count) for i in range(5)), ",".join(map(str, drafters))


@dataclass
class Attempt:
    """One launch: its exit status, the log bytes it wrote, what it left behind after its stop."""

    rc: int | None
    data: bytes
    stopped_in: float
    left: set[int]
    over_mib: float


def attempt(work: Path, seconds: float, count: int, profile: str = "full") -> Attempt:
    """Launch ``profile``, let it run ``seconds``, SIGTERM its group, and check the release.

    :param count: the GPUs to use; 0 is the ``--cpu`` dry run (no GPU memory read).
    """
    log = work / "train.log"
    start = log.stat().st_size if log.exists() else 0
    before = gpu_memory(count) if count else {}
    targets, drafters = layout(count) if count else ("0,1,2,3,4", "5,6,7")
    argv = ["bash", str(RUN_SH), "--target-devices", targets, "--drafter-devices", drafters]
    argv += ["--profile", profile] if count else ["--cpu", "--profile", profile]
    argv += ["--log", str(log), "--checkpoint-dir", str(work / "ckpt"), "--metric-every", "10"]
    with (work / "stdout.log").open("ab") as out:
        env = {**os.environ, "PYTHON": sys.executable}  # run.sh's interpreter: this one, with torch
        proc = subprocess.Popen(
            argv, cwd=work, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        held: set[int] = set()
        deadline = time.monotonic() + START_WITHIN_S  # then ``seconds`` from the first drafter line
        started: float | None = None
        while time.monotonic() < deadline and proc.poll() is None:
            held |= ((gpu_pids() or set()) if count else set()) & session_pids(proc.pid)
            if started is None and log.exists() and b'"drafter"' in log.read_bytes()[start:]:
                started = time.monotonic()
                deadline = started + seconds
            time.sleep(2.0)
        t0 = time.monotonic()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            rc: int | None = proc.wait(timeout=STOP_WITHIN_S)
        except subprocess.TimeoutExpired:
            rc = None
        stopped_in = time.monotonic() - t0
        release = time.monotonic() + RELEASE_WITHIN_S
        while True:
            left = session_pids(proc.pid) | ((gpu_pids() or set()) & held if count else set())
            now = gpu_memory(count) if count else {}
            over = max((now.get(i, 0.0) - before.get(i, 0.0) for i in now), default=0.0)
            if (not left and over <= RELEASE_SLACK_MIB) or time.monotonic() > release:
                break
            time.sleep(1.0)
        if left:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
    except BaseException:  # interrupted (Ctrl-C, a bug): leave nothing running on the GPUs
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        raise
    data = log.read_bytes()[start:] if log.exists() else b""
    return Attempt(rc, data, stopped_in, left, over)


def numbers(data: bytes) -> tuple[float | None, float | None, str]:
    """Pipeline tokens/s, step p50 (s) and ``top-1/4/8`` text from a log's metric lines."""
    from pipeline.digest.stats import summarise
    from pipeline.observe.metrics import parse_metric_lines

    s = summarise(parse_metric_lines(data, "jsonl"))
    topk = "/".join("n/a" if v is None else f"{v:.1%}" for v in (s.top1, s.top4, s.top8))
    return s.pipeline_tokens_per_s, s.step_p50, topk


def _fmt(value: float | None, pattern: str) -> str:
    return "n/a" if value is None else pattern.format(value)


def check(seconds: float, quick: bool, cpu: bool = False) -> int:
    """The CUDA path (module docstring), or its ``--cpu`` dry run: returns the exit status."""
    import torch

    count = 0 if cpu else torch.cuda.device_count()
    profile = "tiny" if quick or cpu else "full"
    name = "CPU (dry run)" if cpu else torch.cuda.get_device_name(0)
    checks = Checks(quick=False)
    summary = [f"{count}x {name}, {profile} profile"]
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        work = Path(tmp)
        for label, bound in (("run", seconds), ("restart", seconds if quick else max(30.0, seconds / 2))):
            got = attempt(work, bound, count, profile)
            tps, p50, topk = numbers(got.data)
            checks.correct(f"{label}: metric lines written", tps is not None, f"{got.data.count(b'{')} lines")
            checks.correct(
                f"{label}: stopped by SIGTERM, exit 0",
                got.rc == 0,
                f"exit {got.rc} in {got.stopped_in:.0f} s",
            )
            checks.correct(f"{label}: no process left", not got.left, f"left: {sorted(got.left)}")
            if count:
                checks.correct(
                    f"{label}: GPU memory released",
                    got.over_mib <= RELEASE_SLACK_MIB,
                    f"{got.over_mib:.0f} MiB over baseline",
                )
            text = f"{label} {bound:.0f} s: {_fmt(tps, '{:,.0f}')} tokens/s, step p50 {_fmt(p50, '{:.3f}')} s, top-1/4/8 {topk}"
            if label == "restart":
                found = re.search(rb"resume_step=(\d+)", got.data)
                step = int(found.group(1)) if found else 0
                checks.correct("restart: resumed from the checkpoint", step > 0, f"resume_step={step}")
                text += f", resumed at step {step}"
            summary.append(
                text + (f", memory released ({got.over_mib:.0f} MiB over baseline)" if count else "")
            )
    if not quick and not cpu:
        bench = subprocess.run(
            [sys.executable, str(ROOT / "bench" / "topk.py")], capture_output=True, text=True, timeout=900
        )
        last = (bench.stdout.strip().splitlines() or ["topk: no output"])[-1]
        checks.correct("topk benchmark on CUDA", bench.returncode == 0 and "cuda" in last, last)
        summary.append(last)
    print(checks.summary("gpu-check: " + "; ".join(summary)))
    return checks.status


def main() -> int:
    """Parse the arguments; print ``no GPU`` and exit 0 without CUDA, else run the checks."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=120.0, help="the first run's length, seconds")
    parser.add_argument("--quick", action="store_true", help="the tiny profile for 5 s, no top-k benchmark")
    parser.add_argument("--cpu", action="store_true", help="a dry run on the CPU (tiny profile)")
    args = parser.parse_args()
    if args.cpu:
        return check(QUICK_S if args.quick else args.seconds, args.quick, cpu=True)
    why = no_gpu()
    if why is not None:
        print(f"gpu-check: no GPU ({why}) - nothing to check")
        return 0
    return check(QUICK_S if args.quick else args.seconds, args.quick)


if __name__ == "__main__":
    sys.exit(main())
