"""Checkpoints with a manifest: the convention Pitstop reads (standard library only).

Layout of ``CHECKPOINT_DIR``::

    step-000540/            one directory per save, the step in 6 digits
        drafter.pt          the files of the save, any names
        manifest.json       written last: {"step": 540, "time": UNIX_S,
                                          "files": [{"name": "drafter.pt", "size": BYTES, "sha256": HEX}]}
    latest.json             {"step": 540, "dir": "step-000540", ...}: the newest save, for older readers

A save is written into a temporary directory (``.tmp-step-000540.PID``, not starting with
``step-``), its manifest last, and renamed to ``step-NNNNNN`` in one ``rename``: a directory named
``step-…`` is whole unless something damaged it afterwards.  A checkpoint is *complete* when its
manifest parses and each file it names is there with its size (``verify`` with ``sha256=True``
hashes them too).  :func:`save` keeps the newest ``keep`` complete saves and removes the rest; a
save at step S removes those of later steps (a run resumed at S by a rollback abandons them), so
the newest step is always the newest save.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path

MANIFEST = "manifest.json"
LATEST = "latest.json"
STEP_DIR = re.compile(r"^step-(\d{6,})$")
TMP_PREFIX = ".tmp-step-"


def step_dir(root: str | Path, step: int) -> Path:
    """``ROOT/step-NNNNNN`` (6 digits, more when the step needs them)."""
    return Path(root) / f"step-{step:06d}"


def sha256(path: Path) -> str:
    """The file's SHA-256, hex."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def problem(d: Path, *, hashes: bool = False) -> str | None:
    """What is wrong with checkpoint directory ``d`` (None: complete).

    :param hashes: also compare each file's SHA-256 with its manifest's (reads every byte).
    """
    try:
        manifest = json.loads((d / MANIFEST).read_text())
        files = [(str(f["name"]), int(f["size"]), str(f["sha256"])) for f in manifest["files"]]
    except (OSError, ValueError, KeyError, TypeError):
        return f"{d.name} has no readable {MANIFEST}"
    for name, size, digest in files:
        try:
            have = (d / name).stat().st_size
        except OSError:
            return f"{name} is missing"
        if have != size:
            return f"{name} is {have} bytes of {size}"
        if hashes and sha256(d / name) != digest:
            return f"{name} does not match its SHA-256"
    return None


def steps(root: str | Path | None) -> list[int]:
    """The steps of the ``step-NNNNNN`` directories in ``root``, newest first (complete or not)."""
    try:
        names = os.listdir(root) if root else []
    except OSError:
        return []
    return sorted((int(m.group(1)) for n in names if (m := STEP_DIR.match(n))), reverse=True)


def newest_complete(root: str | Path | None, *, hashes: bool = False) -> int | None:
    """The step of the newest complete checkpoint in ``root`` (None: there is none)."""
    return next((s for s in steps(root) if problem(step_dir(root or ".", s), hashes=hashes) is None), None)


def save(root: str | Path, step: int, write: Callable[[Path], None], *, keep: int = 3) -> Path:
    """Write one checkpoint: ``write(tmp)`` puts its files in a temporary directory, the manifest
    is written last, the directory renamed to ``step-NNNNNN`` (one replaced at the same step, and
    any of a later step removed: after a rollback they belong to the abandoned run), then
    ``latest.json`` is updated and all but the newest ``keep`` complete checkpoints removed, with
    any temporary directory a killed save left.

    :returns: the checkpoint's directory.
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f"{TMP_PREFIX}{step:06d}.{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    write(tmp)
    files = [
        {"name": p.name, "size": p.stat().st_size, "sha256": sha256(p)}
        for p in sorted(tmp.iterdir())
        if p.is_file()
    ]
    manifest = {"step": step, "time": time.time(), "files": files}
    with open(tmp / MANIFEST, "w") as f:
        json.dump(manifest, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    for later in (s for s in steps(root) if s > step):  # a rolled-back run's: that timeline is abandoned
        shutil.rmtree(step_dir(root, later), ignore_errors=True)
    final = step_dir(root, step)
    if final.exists():  # a stop at the step it resumed at: the new save replaces the old
        old = root / f"{TMP_PREFIX}{step:06d}.old.{os.getpid()}"
        os.rename(final, old)
        shutil.rmtree(old, ignore_errors=True)
    os.rename(tmp, final)
    latest = root / f"{LATEST}.tmp{os.getpid()}"
    latest.write_text(json.dumps({"step": step, "dir": final.name, "ts": manifest["time"]}) + "\n")
    os.replace(latest, root / LATEST)
    _prune(root, keep)
    return final


def _prune(root: Path, keep: int) -> None:
    """Remove all but the newest ``keep`` complete checkpoints (and older incomplete ones), and
    temporary directories of saves that were killed."""
    kept = 0
    for s in steps(root):
        if problem(step_dir(root, s)) is None:
            kept += 1
            if kept <= keep:
                continue
        elif kept < keep:
            continue  # a damaged one newer than those kept stays, for a person to look at
        shutil.rmtree(step_dir(root, s), ignore_errors=True)
    for p in root.iterdir():
        if p.name.startswith(TMP_PREFIX):  # (this save's own was renamed already)
            shutil.rmtree(p, ignore_errors=True)
