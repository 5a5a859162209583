"""``pipeline.engines`` — what runs a job: the engine seam, the runner written once against it, and
the engines behind it.

- the interface an engine implements and the registry of engines :mod:`~pipeline.engines.base`;
  the runner (restart, start, stop, verify for every engine) :mod:`~pipeline.engines.runner`;
  each step's record and detail line :mod:`~pipeline.engines.steplog`; the workdir steps every
  engine shares (patches, caches) :mod:`~pipeline.engines.workdir`;
- the engines: one host over SSH :mod:`~pipeline.engines.ssh`, a Slurm cluster
  :mod:`~pipeline.engines.slurm`;
- runs whose owner died, reconciled with the host's or cluster's truth :mod:`~pipeline.engines.recovery`.

May import :mod:`pipeline.host`, :mod:`pipeline.observe`, :mod:`pipeline.state` and the loose
modules of :mod:`pipeline`; nothing outside ``pipeline``.
"""
