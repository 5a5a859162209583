"""The restart sequence, written once for every engine: pre-flight → stop → clear cache → patch → launch.

Each engine (:class:`pipeline.engines.ssh.Restarter` for ssh, :class:`pipeline.engines.slurm.SlurmEngine`)
supplies the three steps that differ (:class:`EngineSteps`: pre-flight, stop, launch); the order,
the cancellation checks between steps (:meth:`pipeline.engines.steplog.StepLog.boundary`), the workdir
steps every engine shares (:mod:`pipeline.engines.workdir`) and the handling of a step that aborts the
run (:class:`~pipeline.errors.SequenceAborted` → verdict) live here.  Nothing is stopped before
pre-flight passed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from pipeline.config import JobConfig
from pipeline.engines.steplog import CancelCheck, StepLog
from pipeline.engines.workdir import clear_cache, patch, patch_texts
from pipeline.errors import SequenceAborted
from pipeline.host.remote import RemoteHosts
from pipeline.state.runs import RunRecord
from pipeline.verdict import Step


class EngineSteps(Protocol):
    """The steps of the restart sequence that an engine does its own way.

    Each step begins and ends its :class:`~pipeline.state.runs.StepRecord` through the engine's
    :class:`~pipeline.engines.steplog.StepLog` and raises a :class:`~pipeline.errors.SequenceAborted`
    error when it fails.
    """

    def remember_old(self, run: RunRecord, current: Mapping[str, str]) -> None:
        """Record on ``run`` which old run it replaces (pid, or Slurm job id) from ``current``."""
        ...

    async def preflight_step(
        self,
        run: RunRecord,
        name: str,
        job: JobConfig,
        wants: Mapping[str, str],
        texts: Mapping[str, str],
    ) -> Mapping[str, bool]:
        """Pre-flight; returns which configured patches are applied in the workdir now."""
        ...

    async def stop_step(
        self,
        run: RunRecord,
        name: str,
        job: JobConfig,
        current: Mapping[str, str],
    ) -> None:
        """Stop the old run recorded in ``current``."""
        ...

    async def launch_step(
        self,
        run: RunRecord,
        name: str,
        job: JobConfig,
        current: Mapping[str, str],
    ) -> None:
        """Launch the new run; returns at once, its identity recorded."""
        ...


async def restart_sequence(
    engine: EngineSteps,
    steps: StepLog,
    ssh: RemoteHosts,
    run: RunRecord,
    name: str,
    job: JobConfig,
    *,
    add: Sequence[str] = (),
    remove: Sequence[str] = (),
    fresh_cache: bool = False,
    cancelled: CancelCheck | None = None,
) -> RunRecord:
    """Pre-flight, stop, clear cache, patch, launch; leave ``verify`` WAITING.

    A failed step (or a cancel between two steps) sets the run's verdict and ends it here; the
    failure is not raised (:meth:`pipeline.engines.steplog.StepLog.finish`).

    :param add: patch names to apply; ``remove``: to revert (unknown names fail pre-flight).
    :param fresh_cache: clear the job's ``clear_cache`` paths before the launch.
    :returns: the run as saved.
    """
    run.fresh_cache = fresh_cache
    try:
        current = await steps.current(name)
        engine.remember_old(run, current)
        texts = await patch_texts(steps, run, name, job, [*add, *remove])
        wants = {p: "state" for p in job.patches}
        wants.update({p: "revert" for p in remove})
        wants.update({p: "apply" for p in add})
        applied = await engine.preflight_step(run, name, job, wants, texts)
        await steps.boundary(run, None, cancelled)
        await engine.stop_step(run, name, job, current)
        await steps.boundary(run, Step.STOP, cancelled)
        await clear_cache(ssh, steps, run, name, job, fresh_cache)
        await steps.boundary(run, Step.CLEAR_CACHE, cancelled)
        await patch(ssh, steps, run, name, job, texts, applied, add, remove)
        await steps.boundary(run, Step.PATCH, cancelled)
        await engine.launch_step(run, name, job, current)
        await steps.await_verify(run, job.start_window)
        return run
    except SequenceAborted as stop:
        return await steps.finish(run, stop)
