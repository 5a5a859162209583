"""``pipeline.observe`` — what Pitstop sees of a job, and what it concludes: an engine's
observation and verdict (:mod:`~pipeline.observe.evidence`), resume proof (``resume``), attempts
(``attempts``), the watcher's rules (``watch``), per-rank progress (``progress``), crash classes
(``crashes``), GPUs from ``nvidia-smi`` (``gpus``) and a running job's idle GPUs (``idle``).

May import :mod:`pipeline.host`, :mod:`pipeline.state` and the loose modules of :mod:`pipeline`.
"""
