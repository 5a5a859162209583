"""``pipeline.engines`` — what runs a job: the engine seam and registry (:mod:`~pipeline.engines.base`),
the runner written once against it (:mod:`~pipeline.engines.runner`), each step's record
(:mod:`~pipeline.engines.steplog`), the shared workdir steps (:mod:`~pipeline.engines.workdir`), the
ssh and Slurm engines, and recovery of runs whose owner died (:mod:`~pipeline.engines.recovery`).

May import :mod:`pipeline.config`, :mod:`pipeline.host`, :mod:`pipeline.observe`,
:mod:`pipeline.state`, :mod:`pipeline.errors`, :mod:`pipeline.fmt` and :mod:`pipeline.verdict`
only; nothing outside ``pipeline``.
"""
