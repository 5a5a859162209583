"""``pipeline.observe`` — what Pitstop sees of a job, and what it concludes.

- verification's evidence of a launched run and the verdict it leads to
  :mod:`~pipeline.observe.evidence`; resume proof :mod:`~pipeline.observe.resume`;
- the watcher's rules :mod:`~pipeline.observe.watch`; per-rank progress
  :mod:`~pipeline.observe.progress`; crash classes :mod:`~pipeline.observe.crashes`; the Slurm
  probe :mod:`~pipeline.observe.slurmwatch`; GPUs from ``nvidia-smi``
  :mod:`~pipeline.observe.gpus`.

May import :mod:`pipeline.host`, :mod:`pipeline.state` and the loose modules of :mod:`pipeline`.
"""
