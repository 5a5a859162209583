"""DFlash-style drafter training: launcher (``dflash-main``) plus target and drafter workers.

Run ``python train.py --cpu --profile tiny --log LOG --checkpoint-dir DIR`` (or ``run.sh`` with the same
arguments). The module's top level imports only the standard library, so spawned workers can set their
process title before torch is imported; torch and the model code are imported inside functions.
See README.md for the topology, the metric-line protocol and the stop / resume / failure behaviour.
"""

from __future__ import annotations

import argparse
import ctypes
import io
import json
import multiprocessing
import os
import queue as queue_mod
import signal
import socket
import sys
import time
import traceback
from multiprocessing import resource_tracker
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any

import checkpoints
import faults

HERE = Path(__file__).resolve().parent
STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}
STOP_GRACE_S = 60.0  # after a stop request, how long the launcher waits before killing workers
FAIL_GRACE_S = 1.0  # after a worker failed, how long the launcher waits for the peers it broke to exit
CHECKPOINT_FILE = "drafter.pt"
TARGET_FILE = "target.pt"

_signalled = False  # set by the SIGTERM/SIGINT handler, in the launcher and in every worker
_save_asked = False  # set by the --checkpoint-signal handler in every worker: save, keep training
_children: list[int] = []  # the launcher's workers, which it passes --checkpoint-signal on to


def _on_signal(signum: int, frame: object) -> None:
    global _signalled
    _signalled = True


def _on_save_signal(signum: int, frame: object) -> None:
    global _save_asked
    _save_asked = True
    for pid in _children:  # the launcher's: every worker saves (a group-wide signal arrives twice: one save)
        try:
            os.kill(pid, signum)
        except OSError:
            pass


def save_signal(text: str) -> int:
    """``--checkpoint-signal``'s value as a signal number: a name (``USR1``, ``SIGUSR1``) or a number; 0
    for ``none``.

    :raises argparse.ArgumentTypeError: if ``text`` is no signal, or one the job must not catch (KILL,
        STOP, TERM, INT).
    """
    if text.lower() == "none":
        return 0
    name = text.upper() if text.upper().startswith("SIG") else f"SIG{text.upper()}"
    try:
        num = int(text) if text.isdigit() else int(signal.Signals[name])
    except KeyError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a signal name (USR1) or number") from None
    if num in (signal.SIGKILL, signal.SIGSTOP, *STOP_SIGNALS):
        raise argparse.ArgumentTypeError(f"{text} kills or stops the job: use USR1 or USR2")
    return num


def catch_signals(save: int) -> None:
    """Handle the stop signals (recorded, never fatal) and ``save``, the checkpoint signal (0: none)."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, _on_signal)
    if save:
        signal.signal(save, _on_save_signal)


def set_title(title: str) -> None:
    """Set the process title (``/proc/PID/cmdline``, ``ps``) via setproctitle when it is installed."""
    try:
        import setproctitle  # optional library
    except ImportError:
        return
    setproctitle.setproctitle(title)


class Log:
    """The metric log: one fd opened with O_APPEND; each line goes out in a single ``os.write``.

    :param path: the log file, created if missing; None means stdout (fd 1).
    """

    def __init__(self, path: str | None) -> None:
        self.fd = 1 if path is None else os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def line(self, text: str) -> None:
        """Append ``text`` plus a newline in one write."""
        os.write(self.fd, (text.rstrip("\n") + "\n").encode())

    def metric(self, record: dict[str, Any]) -> None:
        """Append one JSON metric line."""
        self.line(json.dumps(record, separators=(",", ":")))

    def same_file_as(self, fd: int) -> bool:
        """Whether ``fd`` (e.g. 1 or 2) already writes into this log file."""
        try:
            a, b = os.fstat(self.fd), os.fstat(fd)
        except OSError:
            return False
        return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def load_profile(name: str) -> dict[str, Any]:
    """The profile ``name`` (``tiny`` | ``full``) from config.json next to this file.

    :raises SystemExit: if config.json has no such profile.
    """
    profiles = json.loads((HERE / "config.json").read_text())
    if name not in profiles:
        raise SystemExit(f"unknown profile {name!r}; config.json has {sorted(profiles)}")
    cfg: dict[str, Any] = profiles[name]
    return cfg


def read_resume_step(ckpt_dir: str | None, asked: int | None = None, say: Any = print) -> int:
    """The drafter step to resume from: ``asked`` (``--resume-step``; 0: from scratch) when its
    checkpoint is whole, else the newest checkpoint in ``ckpt_dir`` whose manifest matches its
    files, sizes and SHA-256 (0 when there is none).  A damaged newer checkpoint passed over is
    said through ``say`` (``checkpoint step 540 is incomplete: …; resuming from step 530``).

    :raises SystemExit: if ``asked`` names a step without a whole checkpoint (the message lists
        the steps that have one).
    """
    if not ckpt_dir or asked == 0:
        return 0
    if asked is not None:
        why = checkpoints.problem(checkpoints.step_dir(ckpt_dir, asked), hashes=True)
        if why is None:
            return asked
        whole = [
            s
            for s in checkpoints.steps(ckpt_dir)
            if checkpoints.problem(checkpoints.step_dir(ckpt_dir, s)) is None
        ]
        have = ", ".join(map(str, whole)) or "none"
        raise SystemExit(
            f"--resume-step {asked}: checkpoint step {asked} in {ckpt_dir}: {why} (whole checkpoints: {have})"
        )
    for step in checkpoints.steps(ckpt_dir):
        why = checkpoints.problem(checkpoints.step_dir(ckpt_dir, step), hashes=True)
        if why is None:
            return step
        say(f"dflash-main: checkpoint step {step} is incomplete: {why}; not resuming from it")
    return 0


def free_port() -> int:
    """A free TCP port on 127.0.0.1 for the drafters' process-group rendezvous."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Command-line options (see README.md)."""
    p = argparse.ArgumentParser(description="DFlash-style drafter training (targets + DDP drafters).")
    p.add_argument("--cpu", action="store_true", help="run every role as a CPU process (gloo)")
    p.add_argument("--profile", default="tiny", help="config.json profile: tiny | full")
    p.add_argument("--max-steps", type=int, default=0, help="stop after this global drafter step (0: never)")
    p.add_argument("--log", default=None, help="file metric lines are appended to (default: stdout)")
    p.add_argument("--checkpoint-dir", default=None, help="drafter checkpoint dir, resumed from when present")
    p.add_argument("--target-devices", default="0,1,2,3,4", help="CUDA ids of the target workers")
    p.add_argument("--drafter-devices", default="5,6,7", help="CUDA ids of the DDP drafter workers")
    p.add_argument("--metric-every", type=int, default=0, help="steps between metric lines (0: profile's)")
    p.add_argument("--seed", type=int, default=0, help="seed of the target weights, data order, drafter init")
    p.add_argument("--checkpoint-every", type=int, default=None, help="steps between checkpoints (profile's)")
    p.add_argument("--keep-checkpoints", type=int, default=3, help="complete checkpoints kept (the newest K)")
    p.add_argument(
        "--checkpoint-signal",
        type=save_signal,
        default="USR1",
        help="signal that makes the drafters checkpoint and keep training (Slurm's --signal; none: off)",
    )
    p.add_argument(
        "--resume-step",
        type=int,
        default=None,
        help="resume from this step's checkpoint (default: the newest whole one)",
    )
    faults.add_arguments(p)
    return p.parse_args(argv)


# ----------------------------------------------------------------------------------------------------
# workers


def worker_main(spec: dict[str, Any], q: Any, stop_event: Any, targets_stop: Any) -> None:
    """Entry of every spawned worker: title first, then signal handling, then torch and the role loop.

    A worker records SIGTERM/SIGINT in a flag and never dies from it; the launcher coordinates the stop.
    Any exception is written (with traceback) to the log and the worker exits 1; otherwise it exits 0.
    """
    set_title(f"dflash-worker {spec['role']} rank {spec['rank']}")
    if spec.get("slurm"):
        _plain_comm("dflash-worker")
    catch_signals(spec["save_signal"])
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _blocked(spec["save_signal"]))  # blocked across spawn
    log = Log(spec["log"])
    try:
        if spec["role"] == "target":
            run_target(spec, log, q, targets_stop)
            if spec.get("slurm") and spec["rank"] == 0:
                time.sleep(spec["server_grace"])  # task 0 serves the queue: let the others leave first
        else:
            run_drafter(spec, log, q, stop_event)
            if spec.get("slurm") and spec["role_rank"] == 0:
                targets_stop.set()  # no launcher in a Slurm job: the drafters release the targets
    except BaseException:
        text = f"dflash-worker {spec['role']} rank {spec['rank']} failed:\n{traceback.format_exc()}"
        log.line(text)
        if not log.same_file_as(2):
            sys.stderr.write(text)
            sys.stderr.flush()
        os._exit(1)  # skip atexit joins (queue feeder, process group) that could hang a dying job
    sys.stdout.flush()
    sys.stderr.flush()
    # Everything is written (log lines are unbuffered os.write calls, the checkpoint is on disk). Skip the
    # interpreter's teardown: torch/gloo C++ destructors running at exit can abort the process
    # ("terminate called without an active exception", exit -6) although the worker finished cleanly.
    os._exit(0)


def _plain_comm(name: str) -> None:
    """Set the kernel's process name (``comm``, ``/proc/PID/stat``) to ``name``, without spaces.

    setproctitle also sets ``comm`` to the title's first 15 bytes (``dflash-worker t``); Slurm's
    ``proctrack/linuxproc`` misreads a ``comm`` holding a space in ``/proc/PID/stat``, cannot find
    the task among the step's processes and so never signals it.
    """
    try:
        ctypes.CDLL(None).prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME
    except (OSError, AttributeError):
        pass


def _orphaned(spec: dict[str, Any]) -> bool:
    return os.getppid() != spec["launcher_pid"]


def _maybe_fail(spec: dict[str, Any], step: int) -> None:
    """Fault injection for tests: DFLASH_FAIL_AT_STEP / DFLASH_FAIL_ROLE / DFLASH_FAIL_RANK (README)."""
    at = os.environ.get("DFLASH_FAIL_AT_STEP")
    if not at or step != int(at) or spec["role"] != os.environ.get("DFLASH_FAIL_ROLE", "drafter"):
        return
    rank = os.environ.get("DFLASH_FAIL_RANK")
    if (int(rank) if rank else spec["first_rank_of_role"]) == spec["rank"]:
        raise RuntimeError(
            f"DFLASH_FAIL_AT_STEP: injected failure at step {step} ({spec['role']} rank {spec['rank']})"
        )


class Meter:
    """Throughput bookkeeping between metric lines; ``tokens`` is cumulative for this process."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.tokens = 0
        self.window_tokens = 0
        self.window_steps = 0
        self.window_start = time.monotonic()

    def add(self, tokens: int) -> None:
        """Count one finished step of ``tokens`` tokens."""
        self.tokens += tokens
        self.window_tokens += tokens
        self.window_steps += 1

    def record(self, step: int, q: Any, extra: dict[str, Any]) -> dict[str, Any]:
        """The metric record for ``step`` (README table); resets the throughput window."""
        import torch  # lazy: torch after the process title is set (module docstring)

        now = time.monotonic()
        elapsed = max(now - self.window_start, 1e-9)
        device = self.spec["device"]
        mem = torch.cuda.max_memory_allocated(device) if device.startswith("cuda") else None
        rec = {
            "ts": time.time(),
            "step": step,
            "role": self.spec["role"],
            "rank": self.spec["rank"],
            "role_rank": self.spec["role_rank"],
            "device": device,
            "tokens": self.tokens,
            "tokens_per_s": round(self.window_tokens / elapsed, 3),
            "step_time_s": round(elapsed / max(self.window_steps, 1), 6),
            "queue_depth": _qsize(q),
            "pid": os.getpid(),
            **extra,
            "gpu_mem_bytes": mem,
        }
        self.window_tokens = self.window_steps = 0
        self.window_start = now
        return rec


def _qsize(q: Any) -> int | None:
    try:
        return int(q.qsize())
    except NotImplementedError:  # macOS
        return None


def _should_log(step: int, first_step: int, every: int) -> bool:
    return step == first_step or step % every == 0


def _setup_torch(spec: dict[str, Any]) -> Any:
    import torch  # lazy: torch after the process title is set (module docstring)

    torch.set_num_threads(1 if spec["device"] == "cpu" else 4)
    if spec["device"].startswith("cuda"):
        torch.cuda.set_device(spec["device"])
    return torch


def _build_target(spec: dict[str, Any]) -> Any:
    """The frozen target: checkpoint-dir/target.pt if present, else built from the seed (rank 0 saves it)."""
    import torch  # lazy: torch after the process title is set (module docstring)
    from model import TargetLM

    cfg = spec["cfg"]
    t = cfg["target"]
    torch.manual_seed(spec["seed"])
    model = TargetLM(cfg["vocab_size"], t["d_model"], t["n_layers"], t["n_heads"], cfg["seq_len"])
    ckpt_dir = spec["checkpoint_dir"]
    path = Path(ckpt_dir) / TARGET_FILE if ckpt_dir else None
    if path is not None and path.exists():
        model.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
    elif path is not None and spec["role_rank"] == 0:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{TARGET_FILE}.tmp{os.getpid()}")
        torch.save(model.state_dict(), tmp)
        os.replace(tmp, path)
    model.requires_grad_(False).eval()
    return model.to(device=spec["device"], dtype=getattr(torch, cfg["dtype"]))


def run_target(spec: dict[str, Any], log: Log, q: Any, targets_stop: Any) -> None:
    """Target loop: corpus windows -> frozen LM -> (anchor blocks, context features, target tokens) -> queue.

    Each queue item is ``torch.save`` bytes of a dict: ``block`` (N, B) int64 = anchor token then
    MASK_ID; ``features`` (N, C, F) in the profile dtype = the fused-layer features of the C positions
    ending at the anchor; ``labels`` (N, B) int64 = the target's argmax next token at the anchor and at
    the B-1 positions after it. A put waits at most 0.2 s at a time so the loop notices ``targets_stop``
    (set by the launcher once every drafter has exited), then the worker exits 0.
    """
    torch = _setup_torch(spec)
    from data import MASK_ID, WindowSampler, load_corpus  # lazy: imports torch (module docstring)

    cfg = spec["cfg"]
    seq, blk, ctx, per_seq = cfg["seq_len"], cfg["block_size"], cfg["ctx_len"], cfg["blocks_per_seq"]
    model = _build_target(spec)
    data_seed = spec["seed"] * 1_000_003 + 7919 * spec["rank"] + spec["resume_step"]
    sampler = WindowSampler(load_corpus(), seq, cfg["batch_seqs"], seed=data_seed)
    gen = torch.Generator().manual_seed(data_seed + 1)
    meter = Meter(spec)
    step = 0
    try:
        while not targets_stop.is_set() and not _orphaned(spec):
            began = time.monotonic()
            tokens = sampler.next()  # (b, T)
            with torch.no_grad():
                logits, feats = model(tokens.to(spec["device"]), cfg["target"]["feature_layers"])
            preds = logits.argmax(-1).cpu()  # (b, T): the target's next token after each position
            feats = feats.cpu()
            b = tokens.shape[0]
            anchors = torch.randint(ctx - 1, seq - blk + 1, (b, per_seq), generator=gen)  # (b, n)
            rows = torch.arange(b)[:, None, None]
            ctx_idx = anchors[..., None] + torch.arange(-ctx + 1, 1)  # (b, n, C)
            lab_idx = anchors[..., None] + torch.arange(blk)  # (b, n, B)
            block = torch.full((b, per_seq, blk), MASK_ID, dtype=torch.int64)
            block[..., 0] = tokens[torch.arange(b)[:, None], anchors]
            item = {
                "block": block.reshape(-1, blk),
                "features": feats[rows, ctx_idx].reshape(b * per_seq, ctx, -1),
                "labels": preds[rows, lab_idx].reshape(-1, blk),
            }
            buf = io.BytesIO()
            torch.save(item, buf)
            payload = buf.getvalue()
            waiting = faults.WaitReporter(spec, log, "queue")
            while True:
                if targets_stop.is_set() or _orphaned(spec):
                    return
                try:
                    q.put(payload, timeout=0.2)
                    break
                except queue_mod.Full:
                    waiting.poll(step)
                    continue
            step += 1
            faults.slow_if_due(spec, step, began)
            meter.add(tokens.numel())
            _maybe_fail(spec, step)
            faults.crash_if_due(spec, log, step)
            if _should_log(step, 1, spec["metric_every"]):
                log.metric(meter.record(step, q, {}))
            faults.hang_if_due(spec, step, lambda: _orphaned(spec))
    finally:
        if hasattr(q, "cancel_join_thread"):  # a Slurm task's queue is a manager proxy: no pipe
            q.cancel_join_thread()  # never block exit on a full pipe


def _save_checkpoint(spec: dict[str, Any], model: Any, opt: Any, step: int) -> None:
    """Write checkpoint-dir/step-NNNNNN/drafter.pt (drafter, optimizer, step) with its manifest
    (:func:`checkpoints.save`: a temporary directory renamed, the newest ``keep_checkpoints`` kept)."""
    import torch  # lazy: torch after the process title is set (module docstring)

    state = {
        "step": step,
        "profile": spec["profile"],
        "drafter": model.state_dict(),
        "optimizer": opt.state_dict(),
    }
    keep = spec["keep_checkpoints"]
    checkpoints.save(
        spec["checkpoint_dir"], step, lambda d: torch.save(state, d / CHECKPOINT_FILE), keep=keep
    )


def _get_item(spec: dict[str, Any], q: Any) -> bytes:
    while True:
        try:
            item: bytes = q.get(timeout=0.5)
            return item
        except queue_mod.Empty:
            if _orphaned(spec):
                raise RuntimeError("launcher is gone") from None


def run_drafter(spec: dict[str, Any], log: Log, q: Any, stop_event: Any) -> None:
    """Drafter loop (one DDP rank): queue item -> drafter forward/backward -> optimizer step.

    At every step boundary the ranks all-reduce (MAX) a local stop flag (SIGTERM seen, the launcher's
    ``stop_event``, launcher gone, or ``max_steps`` reached), so all of them stop after the same step;
    rank 0 then writes the checkpoint and every rank exits 0.  A save flag (the checkpoint signal
    seen, e.g. Slurm's ``--signal=USR1@120`` before the time limit) is all-reduced with it: rank 0
    writes the checkpoint of that step (of the first step trained, when it came before) and every
    rank trains on.
    """
    global _save_asked
    torch = _setup_torch(spec)
    import torch.distributed as dist  # lazy: torch after the process title is set (module docstring)
    import torch.nn.functional as F
    from metrics import topk_accuracy
    from model import Drafter
    from torch.nn.parallel import DistributedDataParallel as DDP

    cfg = spec["cfg"]
    dev = torch.device(spec["device"])
    cuda = dev.type == "cuda"
    dist.init_process_group(
        "nccl" if cuda else "gloo",
        init_method=f"tcp://{spec.get('rendezvous', '127.0.0.1')}:{spec['port']}",
        rank=spec["role_rank"],
        world_size=spec["world_size"],
    )
    t, dr = cfg["target"], cfg["drafter"]
    torch.manual_seed(spec["seed"] + 1)
    model = Drafter(
        cfg["vocab_size"],
        dr["d_model"],
        dr["n_layers"],
        dr["n_heads"],
        feature_dim=len(t["feature_layers"]) * t["d_model"],
        block_size=cfg["block_size"],
        ctx_len=cfg["ctx_len"],
    ).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg["lr"], weight_decay=cfg["weight_decay"])
    step = spec["resume_step"]
    if step:
        path = checkpoints.step_dir(spec["checkpoint_dir"], step) / CHECKPOINT_FILE
        state = torch.load(path, map_location=dev, weights_only=True)
        if state["profile"] != spec["profile"]:
            raise RuntimeError(f"{path} is for profile {state['profile']!r}, not {spec['profile']!r}")
        model.load_state_dict(state["drafter"])
        opt.load_state_dict(state["optimizer"])
        step = int(state["step"])
    ddp = DDP(model, device_ids=[dev.index] if cuda else None)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=cuda and cfg["dtype"] == "bfloat16")
    meter = Meter(spec)
    first_step = step + 1
    flag = torch.zeros(2, dtype=torch.int32, device=dev)  # [stop, save]
    max_steps = spec["max_steps"]
    while True:
        local_stop = _signalled or stop_event.is_set() or _orphaned(spec) or 0 < max_steps <= step
        flag[0], flag[1] = int(local_stop), int(_save_asked)
        work = dist.all_reduce(flag, op=dist.ReduceOp.MAX, async_op=True)
        faults.wait_work(work, faults.WaitReporter(spec, log, "all_reduce"), step, lambda: _orphaned(spec))
        stop, save = flag.tolist()
        if stop:
            break
        if save and step > spec["resume_step"]:  # one checkpoint of this step (once it trained), then on
            _save_asked = False
            if spec["role_rank"] == 0 and spec["checkpoint_dir"]:
                _save_checkpoint(spec, model, opt, step)
                name = signal.Signals(spec["save_signal"]).name
                log.line(
                    f"dflash-worker drafter rank {spec['rank']}: checkpoint step {step} on {name} in "
                    f"{spec['checkpoint_dir']}; training goes on"
                )
        began = time.monotonic()
        item = torch.load(io.BytesIO(_get_item(spec, q)), weights_only=True)
        step += 1
        _maybe_fail(spec, step)
        faults.crash_if_due(spec, log, step)
        block, labels = item["block"].to(dev), item["labels"].to(dev)
        feats = item["features"].to(dev, torch.float32)
        with autocast:
            hidden, logits = ddp(block, feats)
            loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        faults.pace(spec, began)
        faults.slow_if_due(spec, step, began)
        meter.add(labels.numel())
        if _should_log(step, first_step, spec["metric_every"]):
            acc = topk_accuracy(
                hidden.detach().flatten(0, 1).float(),
                model.lm_head.weight.detach().float(),
                labels.flatten(),
                cfg["topk_chunk"],
            )
            reported = faults.reported_loss(spec, step, round(loss.item(), 6))
            log.metric(meter.record(step, q, {"loss": reported, **acc}))
        every = spec["checkpoint_every"]
        if spec["role_rank"] == 0 and spec["checkpoint_dir"] and every and step % every == 0:
            _save_checkpoint(spec, model, opt, step)
        faults.hang_if_due(spec, step, lambda: _orphaned(spec))
    if spec["role_rank"] == 0 and spec["checkpoint_dir"]:
        _save_checkpoint(spec, model, opt, step)
        log.line(
            f"dflash-worker drafter rank {spec['rank']}: checkpoint step {step} in {spec['checkpoint_dir']}"
        )
    dist.barrier()  # every rank leaves only once the checkpoint is on disk
    del ddp
    dist.destroy_process_group()


# ----------------------------------------------------------------------------------------------------
# launcher


def _blocked(save: int) -> set[int]:
    """The signals blocked while workers are spawned: the stop signals and the checkpoint signal."""
    return {*STOP_SIGNALS, *([save] if save else [])}


def _devices(arg: str, cpu: bool) -> list[str]:
    ids = [s.strip() for s in arg.split(",") if s.strip()]
    if not ids:
        raise SystemExit(f"empty device list {arg!r}")
    return ["cpu"] * len(ids) if cpu else [f"cuda:{i}" for i in ids]


def _describe(devs: list[str]) -> str:
    return f"[cpu x{len(devs)}]" if all(d == "cpu" for d in devs) else "[" + ",".join(devs) + "]"


def rank_specs(
    args: argparse.Namespace,
    cfg: dict[str, Any],
    resume_step: int,
    fault_plan: dict[str, Any],
    target_devs: list[str],
    drafter_devs: list[str],
    *,
    launcher_pid: int,
    port: int,
) -> list[dict[str, Any]]:
    """One worker spec per rank, targets first (ranks ``0..T-1``), then drafters (``T..T+D-1``).

    The spec is what :func:`worker_main` reads; the launcher and the Slurm task (``slurm_task.py``)
    both build their workers from it.  ``port`` is the drafters' DDP rendezvous port;
    ``launcher_pid`` is the process whose death means the run is over.
    """
    base = {
        "cfg": cfg,
        "profile": args.profile,
        "log": args.log,
        "checkpoint_dir": args.checkpoint_dir,
        "keep_checkpoints": max(1, args.keep_checkpoints),
        "seed": args.seed,
        "resume_step": resume_step,
        "max_steps": args.max_steps,
        "metric_every": args.metric_every or cfg["metric_every"],
        "checkpoint_every": cfg["checkpoint_every"]
        if args.checkpoint_every is None
        else args.checkpoint_every,
        "faults": fault_plan,
        "launcher_pid": launcher_pid,
        "port": port,
        "world_size": len(drafter_devs),
        "save_signal": args.checkpoint_signal,
    }
    roles = [("target", d) for d in target_devs] + [("drafter", d) for d in drafter_devs]
    return [
        {
            **base,
            "role": role,
            "rank": rank,
            "role_rank": rank if role == "target" else rank - len(target_devs),
            "device": dev,
            "first_rank_of_role": 0 if role == "target" else len(target_devs),
        }
        for rank, (role, dev) in enumerate(roles)
    ]


def main(argv: list[str] | None = None) -> int:
    """Launcher: spawn the workers, watch them, turn SIGTERM into a coordinated stop.

    :param argv: command-line arguments (default: ``sys.argv[1:]``).
    :returns: the exit code: 0 when every worker exited 0, 1 when one failed or a stop timed out,
        2 when CUDA is missing without ``--cpu`` or ``--resume-step`` names no whole checkpoint.
    """
    args = parse_args(argv)
    set_title("dflash-main")
    if (
        args.checkpoint_signal
    ):  # ignored by the resource tracker it starts (a group-wide one must not kill it)
        signal.signal(args.checkpoint_signal, signal.SIG_IGN)
        resource_tracker.ensure_running()
    catch_signals(args.checkpoint_signal)
    cfg = load_profile(args.profile)
    log = Log(args.log)
    if args.cpu:
        os.environ.setdefault("OMP_NUM_THREADS", "1")
    target_devs = _devices(args.target_devices, args.cpu)
    drafter_devs = _devices(args.drafter_devices, args.cpu)
    try:
        resume_step = read_resume_step(args.checkpoint_dir, args.resume_step, log.line)
    except SystemExit as exc:  # --resume-step names a damaged or missing checkpoint
        log.line(f"dflash-main: {exc}")
        return 2
    fault_plan = faults.plan(args, len(target_devs) + len(drafter_devs), resume_step)
    banner = (
        f"dflash-main pid {os.getpid()} targets={_describe(target_devs)} drafters={_describe(drafter_devs)} "
        f"profile={args.profile} resume_step={resume_step}"
    )
    print(banner, flush=True)
    if not log.same_file_as(1):
        log.line(banner)

    if not args.cpu:
        import torch  # lazy: torch after the process title is set (module docstring)

        if not torch.cuda.is_available():
            log.line("dflash-main: CUDA is not available; pass --cpu to run on CPU")
            return 2
    # On CPU the launcher never imports torch: the workers are spawned at once (their titles count
    # within a second or two), not after seconds of importing torch, which the launcher never uses.
    # (torch.multiprocessing's spawn context is the standard library's; queue items are bytes.)
    if _signalled:
        log.line("dflash-main: stop requested before start; exit 0")
        return 0
    ctx = multiprocessing.get_context("spawn")
    q = ctx.Queue(maxsize=cfg["queue_size"])
    stop_event, targets_stop = ctx.Event(), ctx.Event()
    procs: list[tuple[str, int, Any]] = []
    # Block the stop signals while spawning: the children inherit the mask, so a SIGTERM to the process
    # group during their start-up stays pending until their handler is installed.
    signal.pthread_sigmask(signal.SIG_BLOCK, _blocked(args.checkpoint_signal))
    try:
        specs = rank_specs(
            args,
            cfg,
            resume_step,
            fault_plan,
            target_devs,
            drafter_devs,
            launcher_pid=os.getpid(),
            port=free_port(),
        )
        for spec in specs:
            p = ctx.Process(target=worker_main, args=(spec, q, stop_event, targets_stop))
            p.start()
            procs.append((spec["role"], spec["rank"], p))
            _children.append(p.pid)
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _blocked(args.checkpoint_signal))
    try:
        return _watch(procs, log, stop_event, targets_stop)
    finally:
        q.cancel_join_thread()
        q.close()


def _watch(procs: list[tuple[str, int, Any]], log: Log, stop_event: Any, targets_stop: Any) -> int:
    """Monitor the workers until they all exit; 0 only if every one of them exited 0."""
    deadline: float | None = None
    while True:
        if _signalled and not stop_event.is_set():
            stop_event.set()
            deadline = time.monotonic() + STOP_GRACE_S
            log.line("dflash-main: stop requested; drafters stop at the next step boundary")
        failed = [(role, rank, p) for role, rank, p in procs if p.exitcode not in (None, 0)]
        if failed:
            # one rank's failure breaks its peers' collectives within moments: let those exit too,
            # so every failed rank is named (the first one to fail is not always the first polled)
            grace = time.monotonic() + FAIL_GRACE_S
            while time.monotonic() < grace and any(p.exitcode is None for _, _, p in procs):
                time.sleep(0.05)
            for role, rank, p in procs:
                if p.exitcode not in (None, 0):
                    log.line(
                        f"dflash-main: {role} rank {rank} (pid {p.pid}) exited with code {p.exitcode}; "
                        "stopping the job"
                    )
            _kill_all(procs)
            log.line("dflash-main: exit 1")
            return 1
        if all(p.exitcode == 0 for role, _, p in procs if role == "drafter") and not targets_stop.is_set():
            targets_stop.set()
            deadline = min(deadline or float("inf"), time.monotonic() + STOP_GRACE_S)
        if all(p.exitcode == 0 for _, _, p in procs):
            log.line(f"dflash-main: all {len(procs)} workers exited 0; exit 0")
            return 0
        if deadline is not None and time.monotonic() > deadline:
            log.line(f"dflash-main: workers did not stop within {STOP_GRACE_S:.0f}s; killing them; exit 1")
            _kill_all(procs)
            return 1
        wait([p.sentinel for _, _, p in procs if p.exitcode is None], timeout=0.1)


def _kill_all(procs: list[tuple[str, int, Any]]) -> None:
    """SIGKILL every live worker (they ignore SIGTERM by design) and reap them."""
    for _, _, p in procs:
        if p.exitcode is None:
            p.kill()
    for _, _, p in procs:
        p.join(timeout=10)


if __name__ == "__main__":
    sys.exit(main())
