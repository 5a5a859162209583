"""The reference pipeline's workers as the tasks of a Slurm job: ``srun python slurm_task.py ARGS``.

Takes ``train.py``'s options.  Each task is one worker (no launcher); see README.md, "On Slurm".
"""

from __future__ import annotations

import os
import queue as queue_mod
import sys
import threading
import time
from multiprocessing.managers import BaseManager

import faults
from train import _devices, catch_signals, load_profile, parse_args, rank_specs, read_resume_step, worker_main

SERVER_GRACE_S = 3.0  # task 0 keeps serving the queue this long after the targets stop
CONNECT_S = 120.0  # how long tasks other than 0 try to reach task 0's queue server


def main(argv: list[str] | None = None) -> int:
    """One worker as a Slurm task (``srun python slurm_task.py ARGS``): no launcher.

    The global rank is ``SLURM_PROCID`` (targets first, as in the launcher); ``SLURM_NTASKS`` must
    equal the worker count.  Task 0 serves the bounded queue and the two stop events over TCP
    (``multiprocessing.managers``, authkey = the job id) at ``MASTER_ADDR`` (default 127.0.0.1) and
    ``MASTER_PORT`` (default 20000 + job id mod 20000); the drafters' DDP rendezvous is
    ``MASTER_PORT + 1`` of ``DRAFTER_ADDR`` (the node of the first drafter; default ``MASTER_ADDR``).
    A GPU task uses ``cuda:SLURM_LOCALID``.  SIGTERM (``scancel --signal=TERM --full``) reaches every
    task: the drafters stop together at a step boundary (checkpoint as usual), then release the targets.
    The checkpoint signal (``--checkpoint-signal``, SIGUSR1: ``sbatch --signal=USR1@120`` without
    ``B:``) reaches every task too: the drafters checkpoint at the next step boundary and train on.

    :returns: 2 on a task count that does not match the roles (never returns otherwise: the worker exits).
    """
    args = parse_args(argv)
    catch_signals(args.checkpoint_signal)  # at once: Slurm's warning signal may come early in a short job
    cfg = load_profile(args.profile)
    if args.cpu:
        os.environ.setdefault("OMP_NUM_THREADS", "1")
    target_devs = _devices(args.target_devices, args.cpu)
    drafter_devs = _devices(args.drafter_devices, args.cpu)
    roles = [("target", d) for d in target_devs] + [("drafter", d) for d in drafter_devs]
    rank = int(os.environ["SLURM_PROCID"])
    ntasks = int(os.environ.get("SLURM_NTASKS", "0"))
    if ntasks != len(roles):
        print(
            f"dflash: {ntasks} Slurm tasks for {len(roles)} workers; run with -n {len(roles)}",
            file=sys.stderr,
        )
        return 2
    job_id = os.environ.get("SLURM_JOB_ID", "0")
    master = os.environ.get("MASTER_ADDR", "127.0.0.1")
    port = int(os.environ.get("MASTER_PORT") or 20000 + int(job_id) % 20000)
    _, dev = roles[rank]
    if dev.startswith("cuda"):
        dev = f"cuda:{os.environ.get('SLURM_LOCALID', '0')}"

    class Serve(BaseManager):
        pass

    class Hub(BaseManager):
        pass

    if rank == 0:
        q: queue_mod.Queue[bytes] = queue_mod.Queue(maxsize=cfg["queue_size"])
        stop_event, targets_stop = threading.Event(), threading.Event()
        Serve.register("queue", callable=lambda: q)
        Serve.register("stop", callable=lambda: stop_event)
        Serve.register("targets_stop", callable=lambda: targets_stop)
        server = Serve(address=("", port), authkey=job_id.encode()).get_server()
        threading.Thread(target=server.serve_forever, daemon=True).start()
    for name in ("queue", "stop", "targets_stop"):
        Hub.register(name)
    hub = Hub(address=(master, port), authkey=job_id.encode())
    deadline = time.monotonic() + CONNECT_S
    while True:
        try:
            hub.connect()
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    resume_step = read_resume_step(args.checkpoint_dir, args.resume_step, lambda line: None)
    spec = {
        **rank_specs(
            args,
            cfg,
            resume_step,
            faults.plan(args, len(roles), resume_step),
            target_devs,
            drafter_devs,
            launcher_pid=os.getppid(),  # slurmstepd: gone means the step is gone
            port=port + 1,
        )[rank],
        "device": dev,
        "rendezvous": os.environ.get("DRAFTER_ADDR", master),
        "slurm": True,
        "server_grace": SERVER_GRACE_S,
    }
    worker_main(spec, hub.queue(), hub.stop(), hub.targets_stop())  # type: ignore[attr-defined]
    return 0


if __name__ == "__main__":
    sys.exit(main())
