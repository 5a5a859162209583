"""`pitstop demo` end to end: the default script on real parts, and a broken script."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _leftovers(marker: str) -> list[str]:
    """Processes whose command line or cwd mention ``marker`` (the demo's temp root)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmdline = (
                Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            )
            cwd = os.readlink(f"/proc/{entry}/cwd")
        except OSError:
            continue
        if marker in cmdline or marker in cwd:
            out.append(f"{entry}: {cmdline.strip()}")
    return out


def _demo(tmp_path: Path, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "TMPDIR": str(tmp_path),
        "PITSTOP_DEMO_DIGEST_EVERY": "600",
        "COLUMNS": "160",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    env.pop("SLACK_BOT_TOKEN", None)
    env.pop("SLACK_APP_TOKEN", None)
    return subprocess.run(
        [sys.executable, "-m", "bot.cli", "demo", *args],
        capture_output=True,
        text=True,
        cwd=tmp_path,  # the demo keeps its charts under the working directory
        env=env,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


@pytest.mark.timeout(600)
def test_default_script_end_to_end(tmp_path: Path) -> None:
    """The default story: patched restart verified 8/8, digest for all 8 ranks, a killed job alerted and
    resolved, a hung rank 6 named in one stuck-rank alert with its stacks, a restart resumed from the
    checkpoint, no leftovers."""
    script = tmp_path / "script.txt"
    script.write_text((ROOT / "demo" / "script.txt").read_text() + "patches dflash\n")
    done = _demo(tmp_path, "--script", str(script), timeout=560)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-6000:]
    assert "Traceback" not in out
    assert re.search(r"RUNNING 8/8 processes pid \d+", out), out[-4000:]
    verifies = [float(s) for s in re.findall(r"✓ verify ([\d.]+) s", out)]
    # each verify waited make demo's 10 s window (the upper bound only catches a hang)
    assert len(verifies) == 5 and all(10 <= s < 60 for s in verifies), verifies
    assert re.search(r"topk.*(in effect|applied)", out, re.IGNORECASE), out[-4000:]
    assert len(re.findall(r"\[incident dflash:\d+\] dflash is down:", out)) == 1, out[-4000:]
    assert len(re.findall(r"\[incident dflash:\d+\] dflash has a stuck rank", out)) == 1, out[-4000:]
    assert re.search(r"rank 6 \(drafter\) stuck at step \d+ for \d+ s, pid \d+", out), out[-4000:]
    assert "hang evidence for rank 6" in out and "hang_if_due" in out, out[-4000:]  # py-spy's stack
    assert re.search(r"RUNNING 8/8 processes pid \d+, resumed at step [1-9]\d*", out), out[-4000:]
    assert len(re.findall(r"resolved after", out)) == 2, out[-4000:]
    for rank in range(8):  # every rank reported, with numbers (the script waits for all of them)
        row = rf"^\s*{rank}\s+│\s+(target|drafter)\s+│\s+cpu\s+│\s+[\d,]+\s+│"
        assert re.search(row, out, re.MULTILINE), f"rank {rank} missing from the digest"
    assert "silent" not in out
    assert "demo complete" in out
    assert _leftovers(str(tmp_path)) == []
    # the printed chart outlives the demo's temp dir (deleted): it is kept in ./pitstop-demo-charts
    charts = re.findall(r"^chart: (\S+\.png)\s*$", out, re.MULTILINE)
    assert charts and all(Path(c).parent == tmp_path / "pitstop-demo-charts" for c in charts), charts
    assert all(Path(c).read_bytes().startswith(b"\x89PNG") for c in charts)
    assert [p.name for p in tmp_path.glob("pitstop-demo-*")] == ["pitstop-demo-charts"]  # temp dir gone


@pytest.mark.timeout(300)
def test_broken_script_line_stops_and_cleans_up(tmp_path: Path) -> None:
    """A malformed directive stops the demo with a clear error, exit 2, and nothing left running."""
    script = tmp_path / "bad.txt"
    script.write_text("status dflash\nwait forever dflash\n")
    done = _demo(tmp_path, "--script", str(script), timeout=240)
    assert done.returncode == 2
    assert "demo script line 2:" in done.stderr + done.stdout
    assert "Traceback" not in done.stderr + done.stdout
    assert _leftovers(str(tmp_path)) == []


@pytest.mark.timeout(400)
def test_failing_command_stops_demo_and_cleans_up(tmp_path: Path) -> None:
    """A script command that fails (an unknown job) stops the demo, says why, and leaves no process behind."""
    script = tmp_path / "typo.txt"
    script.write_text("status dflash\nrestart dflsh\nhistory\n")
    done = _demo(tmp_path, "--script", str(script), timeout=360)
    out = done.stdout + done.stderr
    assert done.returncode == 2, out[-4000:]
    assert "did you mean 'dflash'" in out
    assert "Traceback" not in out
    assert _leftovers(str(tmp_path)) == []
