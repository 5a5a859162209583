"""The benchmarks cannot rot: each one's quick mode (small sizes) runs here and must end with its summary line.

Nothing here looks at a speed: a quick run checks only correctness conditions (see bench/benchlib.py).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
SUMMARY = {"ack": "ack:", "digest": "digest:", "restart": "restart:", "topk": "topk:", "watch": "watch:"}
SUMMARY["requeue"] = "requeue:"  # on its own test cluster (tests/fixtures/slurm.py)
SUMMARY["gpu_check"] = "gpu-check:"  # without CUDA: "gpu-check: no GPU (…)", exit 0
#: seconds a quick run may take (with CUDA, gpu_check launches the tiny profile twice: ~1 min)
TIMEOUT = {"gpu_check": 300, "requeue": 200}


def test_every_benchmark_has_a_smoke_run() -> None:
    """Every bench/*.py but the shared benchlib is listed here, so a new benchmark cannot escape the smoke runs."""
    assert {p.stem for p in BENCH.glob("*.py")} - {"benchlib"} == set(SUMMARY)


@pytest.mark.parametrize("name", sorted(SUMMARY))
def test_quick_mode_completes_with_its_summary_line(name: str) -> None:
    """`bench/NAME.py --quick` exits 0 and its last line is its summary line, with no failed condition."""
    proc = subprocess.run(
        [sys.executable, str(BENCH / f"{name}.py"), "--quick"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=TIMEOUT.get(name, 110),
    )
    shown = f"stdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}"
    assert proc.returncode == 0, shown
    lines = proc.stdout.strip().splitlines()
    assert lines and lines[-1].startswith(SUMMARY[name]) and "FAILED" not in lines[-1], shown
