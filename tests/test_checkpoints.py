"""Checkpoints with a manifest as Pitstop reads them: the host helper's ``checkpoints`` check of the
``step-NNNNNN`` convention (written by the reference pipeline's own ``checkpoints.py``)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from pipeline.host.helper import checkpoint_info, op_checkpoints

DFLASH = Path(__file__).resolve().parents[1] / "pipeline" / "dflash"


def pipeline_checkpoints() -> Any:
    """The reference pipeline's ``checkpoints`` module (the convention's writer)."""
    sys.path.insert(0, str(DFLASH))
    try:
        import checkpoints

        return checkpoints
    finally:
        sys.path.remove(str(DFLASH))


def write_steps(root: Path, *steps: int, size: int = 64) -> None:
    """Checkpoints at ``steps`` as the pipeline saves them: drafter.pt and optimizer.pt, a manifest."""
    ck = pipeline_checkpoints()

    def files(d: Path) -> None:
        (d / "drafter.pt").write_bytes(os.urandom(size))
        (d / "optimizer.pt").write_bytes(os.urandom(size // 2))

    for step in steps:
        ck.save(root, step, files, keep=len(steps))


def test_the_helper_checks_each_checkpoint_against_its_manifest(tmp_path: Path) -> None:
    """Newest first; a truncated file, a missing one, a missing manifest and (with sha256) changed
    bytes are each named; intact ones say how they were verified."""
    root = tmp_path / "ckpt"
    write_steps(root, 510, 520, 530, 540)
    os.truncate(root / "step-000540" / "drafter.pt", 30)
    (root / "step-000520" / "optimizer.pt").unlink()
    (root / "step-000510" / "manifest.json").unlink()
    answer = op_checkpoints({"dir": str(root), "sha256": False, "step": None})
    got = {e["step"]: (e["damage"], e["verified"]) for e in answer["checkpoints"]}
    assert [e["step"] for e in answer["checkpoints"]] == [540, 530, 520, 510]
    assert got[540] == ({"why": "size", "file": "drafter.pt", "size": 30, "expected": 64}, None)
    assert got[530] == (None, "size")
    assert got[520] == ({"why": "missing", "file": "optimizer.pt", "size": None, "expected": 32}, None)
    assert got[510] == ({"why": "manifest", "file": None, "size": None, "expected": None}, None)
    entry = answer["checkpoints"][1]
    assert (entry["files"], entry["bytes"]) == (2, 96) and entry["path"].endswith("step-000530")
    info = checkpoint_info(str(root))
    assert info is not None and info["step"] == 530 and info["file"].endswith("step-000530/manifest.json")

    (root / "step-000530" / "drafter.pt").write_bytes(b"\0" * 64)  # same size, other bytes
    hashed = op_checkpoints({"dir": str(root), "sha256": True, "step": None})["checkpoints"]
    assert hashed[1]["damage"] == {"why": "sha256", "file": "drafter.pt", "size": 64, "expected": 64}
    assert (
        op_checkpoints({"dir": str(root), "sha256": False, "step": None})["checkpoints"][1]["verified"]
        == "size"
    )


def test_latest_json_alone_still_reads(tmp_path: Path) -> None:
    """A job that writes only ``latest.json`` (no step directories) keeps its old reading."""
    (tmp_path / "latest.json").write_text(json.dumps({"step": 12000}))
    info = checkpoint_info(str(tmp_path))
    assert info is not None and info["step"] == 12000
    assert op_checkpoints({"dir": str(tmp_path), "sha256": True, "step": None})["checkpoints"] == []
