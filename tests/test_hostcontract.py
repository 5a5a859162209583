"""The host helper's contract: the shipped source is Python 3.8 and self-contained, and every
operation's real answer has exactly the keys its TypedDict declares."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import typing
from collections.abc import Mapping
from pathlib import Path

import pytest

from pipeline.host import probe as hostprobe
from pipeline.host.contract import (
    HELPER_VERSION,
    MARKER,
    CheckpointDamage,
    CheckpointEntry,
    ExitRecord,
    FileInfo,
    HangProcess,
    JobState,
    PreflightCheck,
    ProcStat,
    StopTarget,
)
from pipeline.host.helper import OPS, proc_stat
from pipeline.host.probe import helper_source
from tests.fixtures.ssh import BIN

#: operation name → (its arguments, its answer), as ``Ops`` types them
OPERATIONS = {
    op.name: typing.get_args(op.__orig_class__)
    for op in vars(hostprobe.Ops).values()
    if isinstance(op, hostprobe.Op)
}


def _python38() -> str | None:
    """A working Python 3.8 on this machine, if there is one (the oldest the helper supports)."""
    pyenv = sorted(str(p) for p in (Path.home() / ".pyenv" / "versions").glob("3.8.*/bin/python3.8"))
    for cand in (shutil.which("python3.8"), *pyenv):
        if cand and os.access(cand, os.X_OK):
            ok = subprocess.run([cand, "-c", "pass"], capture_output=True, check=False)
            if ok.returncode == 0:
                return cand
    return None


PY38 = _python38()
PYTHONS = [sys.executable, *([PY38] if PY38 else [])]


def _keys(td: type) -> tuple[frozenset[str], frozenset[str]]:
    return td.__required_keys__, td.__optional_keys__  # a TypedDict's runtime record of its keys


def assert_shape(answer: Mapping[str, object], td: type, what: str) -> None:
    """``answer`` holds every required key of ``td`` and no key it does not declare."""
    required, optional = _keys(td)
    assert required <= answer.keys(), f"{what}: missing {sorted(required - answer.keys())}"
    assert answer.keys() <= required | optional, (
        f"{what}: undeclared {sorted(answer.keys() - required - optional)}"
    )


def run_helper(python: str, op: str, args: Mapping[str, object], stdin: str = "") -> dict[str, object]:
    """Run the shipped helper source as a host runs it; its JSON answer (exit status 0)."""
    argv = [python, *hostprobe.helper_argv(op)[1:]]
    text = hostprobe.helper_input(args, stdin)
    proc = subprocess.run(argv, input=text, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, (op, proc.stdout, proc.stderr)
    answer: dict[str, object] = json.loads(proc.stdout)
    return answer


def test_shipped_source_is_python38_self_contained_and_versioned() -> None:
    """The source sent to hosts parses as Python 3.8, imports nothing from Pitstop (the contract
    is inside it) and starts with the marker and the one protocol version."""
    src = helper_source()
    assert src.splitlines()[0] == f"{MARKER} v{HELPER_VERSION}"
    tree = ast.parse(src, feature_version=(3, 8))
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not {m for m in imported if m.split(".")[0] in ("pipeline", "handlers", "bot")}
    assert "class ProbeAnswer(TypedDict)" in src


def test_every_operation_has_a_contract_and_a_typed_call() -> None:
    """The helper's operations are exactly those of ``Ops``, each typed by its contract's arguments
    and answer (``FooArgs``, ``FooAnswer``)."""
    assert set(OPS) == set(OPERATIONS)
    for name, (args, answer) in OPERATIONS.items():
        stem = "".join(part.title() for part in name.split("_"))
        assert (args.__name__, answer.__name__) == (f"{stem}Args", f"{stem}Answer")


def test_proc_stat_is_a_named_record() -> None:
    """``/proc/PID/stat`` reads into a ProcStat whose fields name what they hold."""
    st = proc_stat(os.getpid())
    assert isinstance(st, ProcStat)
    assert st.state in ("R", "S") and st.ppid == os.getppid() and st.start_time > 0
    assert proc_stat(2**22 + 12345) is None


@pytest.mark.parametrize("python", PYTHONS, ids=lambda p: "python3.8" if p == PY38 else "python3")
def test_every_answer_has_its_contracts_keys(python: str, tmp_path: Path) -> None:
    """Each operation run as shipped (under the test's Python and, when present, Python 3.8)
    answers with the keys its TypedDict declares, nested records included."""
    log = tmp_path / "train.log"
    log.write_text("step 1\nstep 2\nresume_step=2\n")
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "a.bin").write_bytes(b"xx")
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "latest.json").write_text('{"step": 2}')
    none = {"pid": None, "start_time": None, "sid": None}
    job = {"name": "j", "match": "(?!x)x", "workdir": str(tmp_path), **none}

    def check(op: str, args: Mapping[str, object], stdin: str = "") -> dict[str, object]:
        answer = run_helper(python, op, args, stdin)
        assert_shape(answer, OPERATIONS[op][1], op)
        return answer

    pre = check(
        "preflight",
        {
            "workdir": str(tmp_path),
            "program": "sh",
            "log": str(log),
            "min_free": 0,
            "patches": {},
            "running": job,
        },
    )
    for c in pre["checks"]:
        assert_shape(c, PreflightCheck, "preflight check")
    assert_shape(pre["running"], JobState, "preflight running")

    launched = check(
        "launch", {"workdir": str(tmp_path), "argv": ["sh", "-c", "echo hi; sleep 30"], "log": str(log)}
    )
    pid, start = launched["pid"], launched["start_time"]
    ident = {"pid": pid, "start_time": start, "sid": launched["sid"]}
    probe = check("probe", {"jobs": [{**job, **ident, "match": "sleep", "log": str(log)}]})
    state = probe["jobs"]["j"]
    assert_shape(state, JobState, "probe job")
    assert_shape(state["log"], FileInfo, "probe log")
    assert state["alive"] is True

    hang = check("hang", {**job, "pids": [pid]})
    for p in hang["processes"]:
        assert_shape(p, HangProcess, "hang process")

    stop = check("stop", {**job, **ident, "match": "sleep", "term_timeout": 5, "kill_timeout": 5})
    assert stop["targets"] and not stop["survivors"]
    for t in stop["targets"]:
        assert_shape(t, StopTarget, "stop target")

    evidence = check(
        "evidence",
        {
            **job,
            **ident,
            "log": str(log),
            "offset": 0,
            "tail_lines": 5,
            "progress_log": str(log),
            "checkpoint_dir": str(ckpt),
        },
    )
    assert evidence["start_step"] == {"said": 2, "first": None}
    if evidence["status"] is not None:  # the waiter may still be writing it
        assert_shape(evidence["status"], ExitRecord, "exit record")

    check("read", {"path": str(log), "offset": 0, "max_bytes": 100, "inode": None, "zlib": True})
    check("tail", {"path": str(log), "lines": 2})
    cleared = check("clear", {"paths": [str(cache), str(tmp_path / "missing")]})
    assert [c["files"] for c in cleared["cleared"]] == [1, 0]
    check("patches", {"workdir": str(tmp_path)}, stdin="{}")
    check("patch", {"workdir": str(tmp_path), "apply": [], "revert": []}, stdin="{}")
    check("gpu_wait", {"targets": [[pid, start]], "timeout": 0, "nvidia_smi": str(BIN / "nvidia-smi")})
    check("slurm_tasks", {"job": 1, "match": "(?!x)x"})
    check("kernel_oom", {"lines": 5})
    step = ckpt / "step-000002"
    step.mkdir()
    (step / "a.pt").write_bytes(b"ab")
    (step / "manifest.json").write_text(
        json.dumps({"step": 2, "time": 1.0, "files": [{"name": "a.pt", "size": 2, "sha256": "0"}]})
    )
    listed = check("checkpoints", {"dir": str(ckpt), "sha256": True, "step": None})
    for e in listed["checkpoints"]:
        assert_shape(e, CheckpointEntry, "checkpoint")
        assert_shape(e["damage"], CheckpointDamage, "checkpoint damage")
