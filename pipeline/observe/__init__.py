"""``pipeline.observe`` — what Pitstop sees of a job, and what it concludes.

- an engine's observation of a launched run and the one verdict decision from it
  :mod:`~pipeline.observe.evidence`; resume proof :mod:`~pipeline.observe.resume`; attempts — how
  far each launched run got, what a restart lost, throughput since it, progress toward
  ``total_steps`` :mod:`~pipeline.observe.attempts`;
- the watcher's rules :mod:`~pipeline.observe.watch`; per-rank progress
  :mod:`~pipeline.observe.progress`; crash classes :mod:`~pipeline.observe.crashes`; GPUs from
  ``nvidia-smi`` :mod:`~pipeline.observe.gpus`, and a running job's idle GPUs
  :mod:`~pipeline.observe.idle`.

May import :mod:`pipeline.host`, :mod:`pipeline.state` and the loose modules of :mod:`pipeline`.
"""
