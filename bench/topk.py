"""Benchmark: the drafter's top-k metric per chunk, before and after ``patches/topk.diff``, side by side.

The "before" code is ``pipeline/dflash/metrics.py`` as shipped (vocabulary logits + topk computed twice
per chunk, for k=4 and k=8); the "after" code is a temporary copy of the directory with the patch
applied by ``git apply`` (one logits matmul, one topk(k=8)). Vocabulary 248,320 (a modern LLM's):

- CPU: hidden 1024, 256 positions per chunk, fp32 (a 1 GB LM head);
- GPU (when ``torch.cuda.is_available()``): hidden 4096, 1024 positions, bf16.

Prints both times and the ratio per device and ends with ONE summary line starting ``topk:``.
Fails (exit 1) when the two implementations disagree, or when the patched code is slower than
the shipped one (ratio under 1.0x: the patch's one matmul and one topk must not cost more than
two of each).  ``--quick``: a 8,192 vocabulary, hidden 64, 32 positions, one timed repeat, CPU
only, no speed checks.
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import torch
from benchlib import Checks

DFLASH = Path(__file__).resolve().parents[1] / "pipeline" / "dflash"
VOCAB = 248_320


def load_module(path: Path, name: str) -> ModuleType:
    """Import the file ``path`` as a module called ``name`` (no package, no sys.path change)."""
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def patched_copy(dest: Path) -> Path:
    """Copy pipeline/dflash to ``dest`` as its own git repository and ``git apply`` the top-k patch there.

    :returns: the patched ``metrics.py``.
    :raises subprocess.CalledProcessError: if the patch does not apply.
    """
    shutil.copytree(DFLASH, dest, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(["git", "init", "-q"], cwd=dest, check=True)
    subprocess.run(["git", "apply", "patches/topk.diff"], cwd=dest, check=True)
    return dest / "metrics.py"


def best_time(fn: Callable[[], object], repeats: int, sync: Callable[[], None]) -> float:
    """Best wall time in seconds of ``fn`` over ``repeats`` runs, after one warm-up run."""
    fn()
    sync()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - t0)
    return best


def compare(
    before: ModuleType,
    after: ModuleType,
    device: str,
    hidden: int,
    positions: int,
    dtype: torch.dtype,
    repeats: int,
    vocab: int = VOCAB,
) -> tuple[float, float]:
    """Time one chunk of ``positions`` (hidden size ``hidden``) with both implementations on ``device``.

    :returns: (before seconds, after seconds).
    :raises AssertionError: if the two implementations disagree.
    """
    gen = torch.Generator(device=device).manual_seed(0)
    head = torch.randn(vocab, hidden, generator=gen, device=device, dtype=dtype)
    h = torch.randn(positions, hidden, generator=gen, device=device, dtype=dtype)
    labels = torch.randint(0, vocab, (positions,), generator=gen, device=device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    result_before = before.topk_accuracy(h, head, labels, positions)
    result_after = after.topk_accuracy(h, head, labels, positions)
    assert result_before == result_after, (result_before, result_after)
    t_before = best_time(lambda: before.topk_accuracy(h, head, labels, positions), repeats, sync)
    t_after = best_time(lambda: after.topk_accuracy(h, head, labels, positions), repeats, sync)
    mib = head.numel() * head.element_size() / 2**20
    print(
        f"{device}: vocab {vocab} hidden {hidden} positions {positions} {str(dtype).removeprefix('torch.')} "
        f"(head {mib:.0f} MiB): before {t_before:.3f}s after {t_after:.3f}s ratio {t_before / t_after:.2f}x"
    )
    return t_before, t_after


def main() -> int:
    """Run the CPU comparison (and the GPU one when CUDA is available); print the summary line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, one timed repeat, CPU only")
    args = parser.parse_args()
    torch.set_grad_enabled(False)
    checks = Checks(quick=args.quick)
    before = load_module(DFLASH / "metrics.py", "dflash_metrics_before")
    summary = []
    with tempfile.TemporaryDirectory(prefix="topk-bench-") as tmp:
        after = load_module(patched_copy(Path(tmp) / "dflash"), "dflash_metrics_after")
        if args.quick:
            t_b, t_a = compare(before, after, "cpu", 64, 32, torch.float32, 1, vocab=8192)
        else:
            t_b, t_a = compare(before, after, "cpu", 1024, 256, torch.float32, 3)
        summary.append(f"cpu before {t_b:.3f}s after {t_a:.3f}s ratio {t_b / t_a:.2f}x")
        checks.correct("before and after agree on every chunk", True, "asserted per device")
        checks.bound("cpu: patched not slower than shipped", t_b / t_a >= 1.0, f"{t_b / t_a:.2f}x")
        if torch.cuda.is_available() and not args.quick:
            t_b, t_a = compare(before, after, "cuda", 4096, 1024, torch.bfloat16, 20)
            summary.append(f"cuda before {t_b * 1e3:.2f}ms after {t_a * 1e3:.2f}ms ratio {t_b / t_a:.2f}x")
            checks.bound("cuda: patched not slower than shipped", t_b / t_a >= 1.0, f"{t_b / t_a:.2f}x")
        else:
            print("cuda: not available or quick mode, skipped")
    print(checks.summary("topk: " + "; ".join(summary)))
    return checks.status


if __name__ == "__main__":
    sys.exit(main())
