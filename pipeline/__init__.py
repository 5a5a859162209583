"""``pipeline`` — the layer that knows the hosts and the training jobs (not the training pipeline
itself: that is :mod:`pipeline.dflash`, the reference workload).

It knows nothing of Slack, of the handlers or of the surfaces, not even for type hints; ``handlers``
and ``bot`` import it, never the other way round.  Its packages, one concept each:

- :mod:`pipeline.host` — reaching the hosts: SSH, the host-side helper and its contract, Slurm's
  login node;
- :mod:`pipeline.engines` — what runs a job: the engine seam, the restart sequence written once,
  the ssh and Slurm engines;
- :mod:`pipeline.runs` — the run service, the one owner of a run's life: its lock, steps,
  cancellation, verdict, throughput follow-up, the no-progress rule and the runs whose owner died;
- :mod:`pipeline.state` — run state with one owner: runs, incidents, events, the leader lease, every
  Redis key (the only code that touches Redis);
- :mod:`pipeline.observe` — probes, evidence and verdicts: verification, metric lines, the
  watcher's rules, progress, crash classes, GPUs;
- :mod:`pipeline.digest` — throughput digests: the log window, statistics, the chart;
- :mod:`pipeline.dflash` — the reference eight-GPU training workload (hosts run a copy of it);
- :mod:`pipeline.config` — the TOML file, validated once, its models by table.

Loose at the top, imported by all of them: :mod:`~pipeline.errors` (every error with its code),
:mod:`~pipeline.fmt` (formatting for people) and :mod:`~pipeline.verdict` (the steps, the verdict
set and the verdict line).  Text a person reads lives beside the code that produces it.

The packages import one another one way only (config ← host, state ← observe ← digest, engines),
each as its ``__init__`` docstring's "May import" says; ``tests/test_layers.py`` holds them to it.
"""
