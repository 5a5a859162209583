"""``pipeline.observe`` — what Pitstop sees of a job, and what it concludes: an engine's
observation and verdict (:mod:`~pipeline.observe.evidence`), resume proof (``resume``), attempts
(``attempts``) read from the job's metric lines (``metrics``), the watcher's rules (``watch``),
per-rank progress (``progress``), crash classes (``crashes``; their names are config's,
:class:`pipeline.config.jobs.CrashClass`), GPUs from ``nvidia-smi`` (``gpus``) and a running job's
idle GPUs (``idle``).

May import :mod:`pipeline.config`, :mod:`pipeline.host`, :mod:`pipeline.state`,
:mod:`pipeline.errors`, :mod:`pipeline.fmt` and :mod:`pipeline.verdict` only.
"""
