"""The reference DFlash drafter pipeline (pipeline/dflash): real torch, real processes, real signals."""

from __future__ import annotations

import argparse
import ast
import hashlib
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

torch = pytest.importorskip("torch")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

DFLASH = Path(__file__).resolve().parents[1] / "pipeline" / "dflash"
N_TARGETS, N_DRAFTERS = 5, 3
METRIC_KEYS = {
    "ts", "step", "role", "rank", "role_rank", "device", "tokens", "tokens_per_s", "step_time_s", "queue_depth",
}  # fmt: skip
DRAFTER_KEYS = {"loss", "top1", "top4", "top8"}


# ----------------------------------------------------------------------------------------------------
# helpers


class Job:
    """One launch of run.sh in its own session, stdout/stderr appended to the log (as Pitstop does)."""

    def __init__(self, tmp: Path, *args: str, ckpt: Path | None = None, env: dict[str, str] | None = None):
        self.log = tmp / f"train-{time.monotonic_ns()}.log"
        self.ckpt = ckpt or tmp / "ckpt"
        argv = ["bash", str(DFLASH / "run.sh"), "--cpu", "--profile", "tiny"]
        argv += ["--log", str(self.log), "--checkpoint-dir", str(self.ckpt), "--metric-every", "5", *args]
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                start_new_session=True,
                env={**os.environ, "PYTHON": sys.executable, **(env or {})},
            )
        self.pid = self.proc.pid  # run.sh execs python: the launcher's pid, process group and session

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def metrics(self) -> list[dict[str, Any]]:
        """The metric records (JSON lines with a ``role`` and no ``event``: ``waiting`` lines are events)."""
        out = []
        for line in self.text().splitlines():
            if line.startswith("{") and "role" in (rec := json.loads(line)) and "event" not in rec:
                out.append(rec)
        return out

    def wait_for(self, what: str, cond: Callable[[], bool], timeout: float) -> None:
        """Poll ``cond`` until true; fail with the log tail on timeout or if the job exits first."""
        deadline = time.monotonic() + timeout
        while not cond():
            if self.proc.poll() is not None:
                pytest.fail(f"job exited {self.proc.returncode} before {what}:\n{self.text()[-3000:]}")
            if time.monotonic() > deadline:
                pytest.fail(f"no {what} within {timeout}s:\n{self.text()[-3000:]}")
            time.sleep(0.05)

    def wait_exit(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"job still running after {timeout}s:\n{self.text()[-3000:]}")

    def session(self) -> dict[int, str]:
        """pid -> cmdline (NULs as spaces) of every live process in the job's session."""
        return session_processes(self.pid)

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)


def session_processes(sid: int) -> dict[int, str]:
    """pid -> cmdline (NULs as spaces, stripped) of live, non-zombie processes whose session id is ``sid``."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        fields = stat.rpartition(")")[2].split()  # after "(comm)": state ppid pgrp session ...
        if int(fields[3]) == sid and fields[0] != "Z":
            found[int(entry)] = cmdline.replace(b"\0", b" ").decode(errors="replace").strip()
    return found


def worker_titles(procs: dict[int, str]) -> list[str]:
    return sorted(c for c in procs.values() if c.startswith("dflash-worker "))


EXPECTED_TITLES = sorted(
    [f"dflash-worker target rank {r}" for r in range(N_TARGETS)]
    + [f"dflash-worker drafter rank {r}" for r in range(N_TARGETS, N_TARGETS + N_DRAFTERS)]
)


@pytest.fixture
def jobs() -> Iterator[list[Job]]:
    """Jobs started by a test; any still running at teardown get their process group SIGKILLed."""
    started: list[Job] = []
    yield started
    for job in started:
        job.kill()


def wait_session_gone(job: Job, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while job.session():
        if time.monotonic() > deadline:
            pytest.fail(f"processes left in the job's session: {job.session()}")
        time.sleep(0.05)


def load_module(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def git(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = ["git", "-c", "user.email=test@dflash.invalid", "-c", "user.name=dflash test", *args]
    return subprocess.run(cmd, cwd=cwd, check=True, capture_output=True, text=True)


def patched_copy(dest: Path) -> Path:
    """pipeline/dflash copied to ``dest`` as its own committed git repository, topk.diff applied."""
    shutil.copytree(DFLASH, dest, ignore=shutil.ignore_patterns("__pycache__"))
    git(dest, "init", "-q")
    git(dest, "add", "-A")
    git(dest, "commit", "-q", "-m", "as deployed")
    git(dest, "apply", "--check", "patches/topk.diff")
    git(dest, "apply", "patches/topk.diff")
    return dest


# ----------------------------------------------------------------------------------------------------
# the running pipeline


@pytest.mark.timeout(180)
def test_eight_roles_run_titled_and_write_metrics(tmp_path: Path, jobs: list[Job]) -> None:
    """All 8 roles run as titled CPU processes, write documented metric lines from ranks 0-7, exit 0."""
    job = Job(tmp_path, "--max-steps", "30")
    jobs.append(job)
    job.wait_for("8 titled workers", lambda: worker_titles(job.session()) == EXPECTED_TITLES, 60)
    assert job.session()[job.pid].startswith("dflash-main")
    assert job.wait_exit(120) == 0, job.text()[-3000:]

    text = job.text()
    assert f"dflash-main pid {job.pid} targets=[cpu x5] drafters=[cpu x3] profile=tiny resume_step=0" in text
    assert "dflash-main: all 8 workers exited 0; exit 0" in text
    lines = job.metrics()
    assert {m["rank"] for m in lines} == set(range(8))
    for m in lines:
        is_drafter = m["rank"] >= N_TARGETS
        assert METRIC_KEYS <= m.keys(), m
        assert m["role"] == ("drafter" if is_drafter else "target")
        assert m["role_rank"] == (m["rank"] - N_TARGETS if is_drafter else m["rank"])
        assert m["device"] == "cpu" and m["gpu_mem_bytes"] is None
        assert isinstance(m["ts"], float) and isinstance(m["tokens"], int) and m["tokens"] > 0
        assert m["tokens_per_s"] > 0 and m["step_time_s"] > 0 and 0 <= m["queue_depth"] <= 8
        if is_drafter:
            assert DRAFTER_KEYS <= m.keys(), m
            assert m["loss"] > 0
            assert 0 <= m["top1"] <= m["top4"] <= m["top8"] <= 1
    for rank in range(N_TARGETS, N_TARGETS + N_DRAFTERS):
        assert max(m["step"] for m in lines if m["rank"] == rank) == 30
    assert json.loads((job.ckpt / "latest.json").read_text())["step"] == 30
    wait_session_gone(job)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("target", ["launcher", "process-group"])
def test_sigterm_checkpoints_exits_zero_and_resumes(tmp_path: Path, jobs: list[Job], target: str) -> None:
    """SIGTERM (launcher or whole group) -> checkpoint, all exit 0 within 10 s; a restart resumes the step."""
    job = Job(tmp_path)
    jobs.append(job)
    job.wait_for("a drafter metric line", lambda: any(m["role"] == "drafter" for m in job.metrics()), 90)
    assert worker_titles(job.session()) == EXPECTED_TITLES
    t0 = time.monotonic()
    if target == "launcher":
        os.kill(job.pid, signal.SIGTERM)
    else:
        os.killpg(job.pid, signal.SIGTERM)
    rc = job.wait_exit(10)
    assert rc == 0, job.text()[-3000:]
    assert time.monotonic() - t0 < 10
    assert "dflash-main: all 8 workers exited 0; exit 0" in job.text()
    assert "Traceback" not in job.text()
    wait_session_gone(job)
    step = json.loads((job.ckpt / "latest.json").read_text())["step"]
    assert step >= 1
    assert f"checkpoint step {step} in" in job.text()

    again = Job(tmp_path, "--max-steps", str(step + 10), "--metric-every", "1", ckpt=job.ckpt)
    jobs.append(again)
    assert again.wait_exit(120) == 0, again.text()[-3000:]
    assert f"resume_step={step}" in again.text()
    drafter_steps = [m["step"] for m in again.metrics() if m["role"] == "drafter"]
    assert sorted(set(drafter_steps)) == list(range(step + 1, step + 11))
    assert json.loads((job.ckpt / "latest.json").read_text())["step"] == step + 10


@pytest.mark.timeout(180)
@pytest.mark.parametrize("target", ["launcher", "process-group"])
def test_checkpoint_signal_saves_once_and_training_goes_on(
    tmp_path: Path, jobs: list[Job], target: str
) -> None:
    """SIGUSR1 (Slurm's --signal warning; to the launcher or the whole group) -> one whole checkpoint of
    the step the drafters agreed on, said in the log; training goes on until SIGTERM."""
    job = Job(tmp_path, "--metric-every", "1")
    jobs.append(job)
    job.wait_for("a drafter metric line", lambda: any(m["role"] == "drafter" for m in job.metrics()), 90)
    if target == "launcher":
        os.kill(job.pid, signal.SIGUSR1)
    else:
        os.killpg(job.pid, signal.SIGUSR1)
    said = re.compile(r"drafter rank 5: checkpoint step (\d+) on SIGUSR1 in \S+; training goes on")
    job.wait_for("the signal's checkpoint", lambda: said.search(job.text()) is not None, 30)
    step = int(said.findall(job.text())[0])
    ck = _checkpoints_module()
    assert ck.problem(ck.step_dir(job.ckpt, step), hashes=True) is None
    assert json.loads((job.ckpt / "latest.json").read_text())["step"] == step

    def drafter_max() -> int:
        return max((m["step"] for m in job.metrics() if m["role"] == "drafter"), default=0)

    job.wait_for("training past the save", lambda: drafter_max() >= step + 3, 60)
    assert len(said.findall(job.text())) == 1  # one save, though a group-wide signal reached each twice
    os.kill(job.pid, signal.SIGTERM)
    assert job.wait_exit(10) == 0, job.text()[-3000:]
    assert "Traceback" not in job.text()


def test_checkpoint_signal_option_is_checked() -> None:
    """--checkpoint-signal takes a catchable signal's name or number, or none; TERM or a typo is refused, named."""
    sys.path.insert(0, str(DFLASH))  # train.py imports its siblings (checkpoints, faults)
    try:
        train = load_module(DFLASH / "train.py", "dflash_train_signal")
    finally:
        sys.path.remove(str(DFLASH))
    assert [train.save_signal(s) for s in ("USR1", "sigusr2", "10", "none")] == [10, 12, 10, 0]
    for bad, why in (("USR3", "'USR3' is not a signal"), ("TERM", "TERM kills or stops the job")):
        with pytest.raises(argparse.ArgumentTypeError, match=why):
            train.save_signal(bad)


@pytest.mark.timeout(180)
def test_worker_exception_fails_the_job_with_traceback(tmp_path: Path, jobs: list[Job]) -> None:
    """A worker that raises takes the whole job down: non-zero exit, its traceback in the log, no leftovers."""
    job = Job(
        tmp_path, env={"DFLASH_FAIL_AT_STEP": "3", "DFLASH_FAIL_ROLE": "drafter", "DFLASH_FAIL_RANK": "6"}
    )
    jobs.append(job)
    rc = job.wait_exit(120)
    text = job.text()
    assert rc != 0, text[-3000:]
    assert "dflash-worker drafter rank 6 failed:" in text
    assert "Traceback (most recent call last)" in text
    assert "RuntimeError: DFLASH_FAIL_AT_STEP: injected failure at step 3 (drafter rank 6)" in text
    assert "dflash-main: drafter rank 6" in text and "exited with code 1; stopping the job" in text
    wait_session_gone(job)


def waits(job: Job) -> list[dict[str, Any]]:
    """The job's ``waiting`` lines (faults.py), in file order."""
    out = []
    for line in job.text().splitlines():
        if line.startswith("{"):
            rec = json.loads(line)
            if rec.get("event") == "waiting":
                out.append(rec)
    return out


@pytest.mark.timeout(240)
def test_hang_rank_blocks_the_others_wait_then_resume_from_checkpoint(
    tmp_path: Path, jobs: list[Job]
) -> None:
    """--hang-rank 6 --hang-at-step 20: rank 6 stops at 20, ranks 5 and 7 report waiting in the all-reduce;
    a later start resumes from the step-20 checkpoint."""
    job = Job(tmp_path, "--hang-rank", "6", "--hang-at-step", "20", "--checkpoint-every", "10")
    jobs.append(job)

    def drafters_waiting() -> bool:
        return {w["rank"] for w in waits(job) if w["on"] == "all_reduce"} == {5, 7}

    job.wait_for("ranks 5 and 7 waiting in the all-reduce", drafters_waiting, 150)
    lines = job.metrics()
    for rank in (5, 6, 7):
        assert max(m["step"] for m in lines if m["rank"] == rank) == 20
    assert all(w["step"] == 20 and w["role"] == "drafter" for w in waits(job) if w["on"] == "all_reduce")
    assert not [w for w in waits(job) if w["rank"] == 6]
    assert json.loads((job.ckpt / "latest.json").read_text())["step"] == 20
    assert job.proc.poll() is None  # hung, not dead
    job.kill()
    wait_session_gone(job)

    again = Job(tmp_path, "--max-steps", "25", "--metric-every", "1", ckpt=job.ckpt)
    jobs.append(again)
    assert again.wait_exit(150) == 0, again.text()[-3000:]
    assert "resume_step=20" in again.text()
    assert min(m["step"] for m in again.metrics() if m["role"] == "drafter") == 21


CRASH_PRINTS = {
    "nccl_timeout": [
        "Watchdog caught collective operation timeout: WorkNCCL(",
        "terminate called after throwing an instance of 'c10::DistBackendError'",
        "exited with code -6; stopping the job",
    ],
    "cuda_oom": ["torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"],
    "exception": ["RuntimeError: injected exception at step 3 (drafter rank 6)"],
}


@pytest.mark.timeout(180)
@pytest.mark.parametrize("kind", sorted(CRASH_PRINTS))
def test_crash_kind_prints_what_the_real_failure_prints(tmp_path: Path, jobs: list[Job], kind: str) -> None:
    """--crash-rank 6 --crash-at-step 3 --crash KIND: the job fails, printing KIND's real messages."""
    from pipeline.config.jobs import CrashClass
    from pipeline.observe.crashes import classify

    job = Job(tmp_path, "--crash-rank", "6", "--crash-at-step", "3", "--crash", kind, "--metric-every", "1")
    jobs.append(job)
    assert job.wait_exit(150) == 1, job.text()[-3000:]
    text = job.text()
    for printed in CRASH_PRINTS[kind]:
        assert printed in text, text[-3000:]
    assert "dflash-main: drafter rank 6" in text
    wait_session_gone(job)
    found = classify(text.encode())
    assert found.kind is CrashClass(kind if kind != "exception" else "python_exception"), found
    if kind == "exception":
        assert (found.exc_type, found.rank, found.step) == ("RuntimeError", 6, 2), found  # last step logged


def test_fault_options_are_checked() -> None:
    """A fault option without its partners, or a rank out of range, is refused before anything starts."""
    for args, said in [
        (["--hang-rank", "6"], "--hang-rank and --hang-at-step go together"),
        (["--crash-rank", "6", "--crash-at-step", "3"], "go together"),
        (["--hang-rank", "8", "--hang-at-step", "3"], "--hang-rank 8: ranks are 0..7"),
        (["--hang-rank", "6", "--hang-at-step", "+x"], "a step number, or +N"),
    ]:
        proc = subprocess.run(
            [sys.executable, str(DFLASH / "train.py"), "--cpu", *args],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode != 0 and said in proc.stderr, proc.stderr


def test_fault_step_plus_n_counts_from_the_resume_step() -> None:
    """--hang-at-step +30 on a run resuming at 100 hangs after step 130; a plain number stays as given."""
    import argparse

    faults = load_module(DFLASH / "faults.py", "dflash_faults")
    args = argparse.Namespace(
        hang_rank=6, hang_at_step="+30", crash_rank=2, crash_at_step="7", crash="cuda_oom"
    )
    assert faults.plan(args, 8, 100) == {"hang": (6, 130), "crash": (2, 7, "cuda_oom")}


def test_directory_imports_only_stdlib_torch_setproctitle() -> None:
    """pipeline/dflash is self-contained: its modules import only stdlib, torch, setproctitle and each other."""
    local = {p.stem for p in DFLASH.glob("*.py")}
    allowed = set(sys.stdlib_module_names) | {"torch", "setproctitle"} | local
    assert not (DFLASH / "__init__.py").exists()
    for path in DFLASH.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                assert node.level == 0, f"{path.name}: relative import"
                names = [node.module or ""]
            else:
                continue
            for name in names:
                assert name.split(".")[0] in allowed, f"{path.name} imports {name}"


# ----------------------------------------------------------------------------------------------------
# the top-k patch


@pytest.fixture(scope="module")
def metric_modules(tmp_path_factory: pytest.TempPathFactory) -> tuple[ModuleType, ModuleType]:
    """(shipped metrics.py, metrics.py from a git copy with patches/topk.diff applied) as two modules."""
    patched = patched_copy(tmp_path_factory.mktemp("dflash-patched") / "dflash")
    before = load_module(DFLASH / "metrics.py", "dflash_metrics_before")
    after = load_module(patched / "metrics.py", "dflash_metrics_after")
    return before, after


def test_patch_applies_and_halves_the_logits_work(
    metric_modules: tuple[ModuleType, ModuleType], monkeypatch: pytest.MonkeyPatch
) -> None:
    """topk.diff applies with git to a deployed copy; patched code computes vocabulary logits once per chunk."""
    calls = {"before": 0, "after": 0}
    hidden, head = torch.randn(10, 16), torch.randn(64, 16)
    labels = torch.randint(0, 64, (10,))
    results = {}
    for label, module in zip(("before", "after"), metric_modules, strict=True):
        real = module._logits_topk

        def counting(*args: Any, _real: Any = real, _label: str = label) -> Any:
            calls[_label] += 1
            return _real(*args)

        monkeypatch.setattr(module, "_logits_topk", counting)
        results[label] = module.topk_accuracy(hidden, head, labels, chunk=4)  # 3 chunks
    assert calls == {"before": 6, "after": 3}
    assert results["before"] == results["after"]


def reference_topk(logits: Any, labels: Any) -> dict[str, float]:
    """The definition: correct at k iff fewer than k logits are strictly greater than the label's."""
    greater = (logits > logits.gather(1, labels[:, None])).sum(dim=1)
    return {f"top{k}": int((greater < k).sum()) / len(labels) for k in (1, 4, 8)}


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_topk_metrics_identical_with_and_without_patch(
    metric_modules: tuple[ModuleType, ModuleType], data: st.DataObject
) -> None:
    """top-1/4/8 are equal before and after the patch and match the tie-inclusive definition, ties included."""
    n = data.draw(st.integers(1, 24), label="positions")
    vocab = data.draw(st.integers(8, 40), label="vocab")
    chunk = data.draw(st.integers(1, 30), label="chunk")
    values = data.draw(st.lists(st.integers(-3, 3), min_size=n * vocab, max_size=n * vocab), label="logits")
    labels = torch.tensor(
        data.draw(st.lists(st.integers(0, vocab - 1), min_size=n, max_size=n)), dtype=torch.int64
    )
    logits = torch.tensor(values, dtype=torch.float32).reshape(n, vocab)
    head = torch.eye(vocab)  # hidden @ I.T == logits exactly: the logits (and their ties) are drawn directly
    before, after = metric_modules
    expected = reference_topk(logits, labels)
    assert before.topk_accuracy(logits, head, labels, chunk) == expected
    assert after.topk_accuracy(logits, head, labels, chunk) == expected


# ----------------------------------------------------------------------------------------------------
# checkpoints with a manifest (checkpoints.py: the convention Pitstop reads)


def _checkpoints_module() -> Any:
    sys.path.insert(0, str(DFLASH))
    try:
        import checkpoints  # the pipeline's own module, standard library only

        return checkpoints
    finally:
        sys.path.remove(str(DFLASH))


def test_a_save_is_a_renamed_directory_with_its_manifest_and_the_newest_k_are_kept(tmp_path: Path) -> None:
    """Each save is ``step-NNNNNN/`` with a manifest of names, sizes and SHA-256; a save that dies
    mid-write leaves only a temporary directory (not ``step-``), removed by the next; ``keep`` prunes."""
    ck = _checkpoints_module()
    root = tmp_path / "ckpt"
    for step in (10, 20, 30):
        ck.save(root, step, lambda d, s=step: (d / "drafter.pt").write_bytes(b"x" * s), keep=2)
    assert sorted(p.name for p in root.iterdir()) == ["latest.json", "step-000020", "step-000030"]
    manifest = json.loads((root / "step-000030" / "manifest.json").read_text())
    digest = hashlib.sha256(b"x" * 30).hexdigest()
    assert manifest["step"] == 30 and manifest["files"] == [
        {"name": "drafter.pt", "size": 30, "sha256": digest}
    ]
    assert json.loads((root / "latest.json").read_text())["dir"] == "step-000030"

    def dies(d: Path) -> None:
        (d / "drafter.pt").write_bytes(b"half")
        raise KeyboardInterrupt  # killed mid-save

    with pytest.raises(KeyboardInterrupt):
        ck.save(root, 40, dies)
    assert ck.steps(root) == [30, 20] and any(p.name.startswith(".tmp-step-000040") for p in root.iterdir())
    (root / "step-000030" / "drafter.pt").write_bytes(b"x" * 11)  # truncated afterwards
    assert ck.problem(root / "step-000030") == "drafter.pt is 11 bytes of 30"
    assert ck.newest_complete(root) == 20
    (root / "step-000020" / "drafter.pt").write_bytes(b"y" * 20)  # same size, other bytes
    assert ck.problem(root / "step-000020") is None
    assert ck.problem(root / "step-000020", hashes=True) == "drafter.pt does not match its SHA-256"
    ck.save(root, 50, lambda d: (d / "drafter.pt").write_bytes(b"z"), keep=1)
    names = sorted(p.name for p in root.iterdir())
    assert names == ["latest.json", "step-000050"]  # the killed save's temporary directory is gone too


@pytest.mark.timeout(300)
def test_resume_passes_over_a_damaged_checkpoint_and_resume_step_picks_one(
    tmp_path: Path, jobs: list[Job]
) -> None:
    """The newest checkpoint truncated: a start resumes from the newest whole one and says why;
    ``--resume-step`` of the damaged one exits 2 listing the whole ones; of a whole one, resumes there."""
    job = Job(tmp_path, "--checkpoint-every", "5", "--max-steps", "15", "--keep-checkpoints", "2")
    jobs.append(job)
    assert job.wait_exit(150) == 0, job.text()[-3000:]
    assert sorted(p.name for p in job.ckpt.glob("step-*")) == ["step-000010", "step-000015"]
    pt = job.ckpt / "step-000015" / "drafter.pt"
    size = pt.stat().st_size
    os.truncate(pt, size // 2)

    refused = Job(tmp_path, "--resume-step", "15", ckpt=job.ckpt)
    jobs.append(refused)
    assert refused.wait_exit(60) == 2
    assert (
        f"checkpoint step 15 in {job.ckpt}: drafter.pt is {size // 2} bytes of {size} (whole checkpoints: 10)"
        in (refused.text())
    )

    again = Job(tmp_path, "--max-steps", "12", "--metric-every", "1", ckpt=job.ckpt)
    jobs.append(again)
    assert again.wait_exit(150) == 0, again.text()[-3000:]
    said = f"dflash-main: checkpoint step 15 is incomplete: drafter.pt is {size // 2} bytes of {size}; not resuming"
    assert said in again.text() and "resume_step=10" in again.text()
    assert min(m["step"] for m in again.metrics() if m["role"] == "drafter") == 11
    # its save at step 12 removed the abandoned step 15
    assert sorted(p.name for p in job.ckpt.glob("step-*")) == ["step-000010", "step-000012"]

    chosen = Job(tmp_path, "--resume-step", "10", "--max-steps", "11", "--metric-every", "1", ckpt=job.ckpt)
    jobs.append(chosen)
    assert chosen.wait_exit(150) == 0, chosen.text()[-3000:]
    assert "resume_step=10" in chosen.text()
