"""``pipeline.engines`` — what runs a job: the engine seam (:mod:`~pipeline.engines.base`), the
registry of the shipped engines (:data:`ENGINES`),
the runner written once against it (:mod:`~pipeline.engines.runner`), each step's record
(:mod:`~pipeline.engines.steplog`), the shared workdir steps (:mod:`~pipeline.engines.workdir`) and the
ssh and Slurm engines.

May import :mod:`pipeline.config`, :mod:`pipeline.host`, :mod:`pipeline.observe`,
:mod:`pipeline.state`, :mod:`pipeline.errors`, :mod:`pipeline.fmt` and :mod:`pipeline.verdict`
only; nothing outside ``pipeline``.
"""

from __future__ import annotations

from collections.abc import Mapping

from pipeline.config import JobConfig
from pipeline.engines.base import EngineKind
from pipeline.engines.slurm import SlurmEngine
from pipeline.engines.ssh import SshEngine

#: The engines Pitstop ships, by ``[jobs.NAME] engine`` name: the one registry, explicit; a
#: :class:`~pipeline.engines.runner.Runner` is built with it unless given another (a test adds its
#: own: ``{**ENGINES, "local": LocalEngine}``).
ENGINES: Mapping[str, EngineKind] = {"ssh": SshEngine, "slurm": SlurmEngine}


def on_nodes(job: JobConfig) -> bool:
    """Whether ``job``'s engine runs it on cluster nodes that Pitstop can name, drain and leave out
    (the engine class's ``nodes``; False for an engine not in :data:`ENGINES`)."""
    return bool(getattr(ENGINES.get(job.engine), "nodes", False))


def resumes_at_step(job: JobConfig) -> bool:
    """Whether ``job``'s engine passes ``restart JOB from step S`` to its launch (the engine class's
    ``resume_step``; False for an engine not in :data:`ENGINES`)."""
    return bool(getattr(ENGINES.get(job.engine), "resume_step", False))
