"""``pipeline.engines`` — what runs a job: the engine seam and registry (:mod:`~pipeline.engines.base`),
the runner written once against it (:mod:`~pipeline.engines.runner`), each step's record
(:mod:`~pipeline.engines.steplog`), the shared workdir steps (:mod:`~pipeline.engines.workdir`) and the
ssh and Slurm engines.

May import :mod:`pipeline.host`, :mod:`pipeline.observe`, :mod:`pipeline.state` and the loose
modules of :mod:`pipeline`; nothing outside ``pipeline``.
"""
