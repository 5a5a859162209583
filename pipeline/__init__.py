"""``pipeline`` — the layer that knows the hosts and the training jobs (not the training pipeline
itself: that is :mod:`pipeline.dflash`, the reference workload).

It knows nothing of Slack, of the handlers or of the surfaces, not even for type hints; ``handlers``
and ``bot`` import it, never the other way round.  Where each concept lives:

- configuration: :mod:`~pipeline.config` (the TOML file, validated once); Redis key names:
  :mod:`~pipeline.keys`; the Redis connection (embedded or configured): :mod:`~pipeline.redisconn`;
- formatting for people (duration, bytes, clock): :mod:`~pipeline.fmt`; the steps, the verdict
  set and the verdict line, formatted and parsed: :mod:`~pipeline.verdict`; every error with its
  code: :mod:`~pipeline.errors`;
- hosts: SSH execution :mod:`~pipeline.remote` (and :mod:`~pipeline.quoting`); the helper run on
  the host :mod:`~pipeline.hosthelper`, its typed contract :mod:`~pipeline.hostcontract`, and the
  calls and probes built on it :mod:`~pipeline.hostprobe`; GPUs from ``nvidia-smi``
  :mod:`~pipeline.gpus`;
- the restart: the engine interface :mod:`~pipeline.engine`; the sequence written once
  :mod:`~pipeline.sequence`; the ssh engine :mod:`~pipeline.restart` and what it verifies
  :mod:`~pipeline.evidence`; the Slurm engine :mod:`~pipeline.slurmengine` over
  :mod:`~pipeline.slurm`; the workdir steps (patches, caches) :mod:`~pipeline.workdir`; each
  step's record and detail line :mod:`~pipeline.steplog`; resume proof :mod:`~pipeline.resume`;
- run records :mod:`~pipeline.runs`; runs whose owner died :mod:`~pipeline.recovery`; one job's
  state in one read :mod:`~pipeline.jobstate`; events :mod:`~pipeline.events`; the scheduler's
  leader lease :mod:`~pipeline.leader`;
- watching: the rules :mod:`~pipeline.watch`; incidents, opened and resolved once each
  :mod:`~pipeline.incidents`; per-rank progress :mod:`~pipeline.progress`; crash classes
  :mod:`~pipeline.crashes`; the Slurm probe :mod:`~pipeline.slurmwatch`;
- digests: metric lines :mod:`~pipeline.metrics`, the window read :mod:`~pipeline.logwindow`,
  statistics :mod:`~pipeline.digeststats`, the digest :mod:`~pipeline.digest`, its chart
  :mod:`~pipeline.chart`.

Text a person reads lives beside the code that produces it: step details in
:mod:`~pipeline.steplog` and :mod:`~pipeline.workdir`, verdict lines in :mod:`~pipeline.verdict`,
error text inside each error class.
"""
