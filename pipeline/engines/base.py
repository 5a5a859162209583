"""What runs a job: the engine interface the restart sequence is written against.

A job's ``engine`` (``[jobs.NAME] engine``) says how its processes are started, stopped and
seen: ``"ssh"`` (the default: one process group on one host, :class:`pipeline.engines.ssh.Restarter`)
or ``"slurm"`` (a batch job on a Slurm cluster, :class:`pipeline.engines.slurm.SlurmEngine`).
Every engine runs the same named steps (:class:`pipeline.verdict.Step`) with the same meaning —
``preflight`` (nothing is touched until it passes), ``stop`` (the old run is gone, its end
recorded), ``clear_cache``, ``patch``, ``launch`` (returns at once), ``verify`` (at
``start_window``) — and ends in the same closed verdict set (:class:`pipeline.verdict.Verdict`).
``docs/engines.md`` maps the steps and states onto Slurm and, on paper, onto Kubernetes.

The :class:`~pipeline.engines.ssh.Restarter` is the entry point for every job; it hands a job whose
engine is not ``"ssh"`` to the engine registered under that name (``Restarter.engines``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from pipeline.config import Config
from pipeline.engines.steplog import CancelCheck, StepListener
from pipeline.host.probe import ProcessCount
from pipeline.host.remote import RemoteHosts
from pipeline.state.runs import RunRecord, RunStore

__all__ = ["CancelCheck", "Engine", "StepListener"]


class Engine(Protocol):
    """The operations an engine provides; each takes a run from :meth:`RunStore.create`.

    Failures are verdicts set on the returned run, not exceptions (except where noted).
    """

    async def restart(
        self,
        run: RunRecord,
        *,
        add: Sequence[str] = (),
        remove: Sequence[str] = (),
        fresh_cache: bool = False,
        cancelled: CancelCheck | None = None,
    ) -> RunRecord:
        """preflight → stop → clear_cache → patch → launch; leaves ``verify`` WAITING (due at
        launch + ``start_window`` in ``keys.runs_unverified``)."""
        ...

    async def start(self, run: RunRecord, *, cancelled: CancelCheck | None = None) -> RunRecord:
        """preflight (refusing a job that runs) → launch; leaves ``verify`` WAITING."""
        ...

    async def stop(self, run: RunRecord) -> RunRecord:
        """The ``stop`` step alone; verdict None on success, ``STOP_FAILED`` otherwise."""
        ...

    async def verify(self, run: RunRecord) -> RunRecord:
        """Decide the verdict from evidence up to launch + ``start_window``.

        :raises RemoteError: if the job cannot be observed until well past the deadline.
        """
        ...

    async def job_processes(self, job: str) -> ProcessCount:
        """The job's processes now (``status``).

        :raises RemoteError: if they cannot be counted.
        """
        ...

    async def log_tail(self, job: str, lines: int) -> str:
        """The last ``lines`` lines of the job's output (``logs``).

        :raises RemoteError: if it cannot be read.
        """
        ...


class RestartService(Engine, Protocol):
    """What the handlers and :mod:`pipeline.engines.recovery` need from :class:`~pipeline.engines.ssh.Restarter`:
    every engine operation (for any job, whatever its engine), the patches in effect, and the
    configuration, SSH pool and run store it works with.  Tests' stand-ins implement it.
    """

    @property
    def config(self) -> Config:
        """The validated configuration."""
        ...

    @property
    def ssh(self) -> RemoteHosts:
        """The connections to the hosts."""
        ...

    @property
    def runs(self) -> RunStore:
        """Run records in Redis."""
        ...

    def subscribe(self, listener: StepListener) -> Callable[[], None]:
        """Tell ``listener`` of every step change of every run (:meth:`StepLog.subscribe`).

        :returns: a function that unsubscribes it.
        """
        ...

    async def patches_in_effect(self, job: str) -> list[str]:
        """Patch names applied in the job's workdir now.

        :raises RemoteError: if the host cannot be reached or git fails.
        """
        ...
