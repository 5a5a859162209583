"""The one interface every engine implements (:class:`Engine`), and what a registry of engines holds.

A job's ``[jobs.NAME] engine`` names the engine that starts, stops and sees its processes:
``"ssh"`` (the default), ``"slurm"``, or any other :class:`EngineKind` in the registry a
:class:`~pipeline.engines.runner.Runner` is built with (:data:`pipeline.engines.ENGINES`, the
shipped ones); :func:`check_engines` checks a config against it.  The runner is written once against
this interface.
``docs/engines.md`` maps the steps and states onto Slurm and, on paper, onto Kubernetes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from pipeline.config import Config, JobConfig
from pipeline.engines.steplog import CancelCheck, StepListener, StepLog
from pipeline.errors import ConfigError
from pipeline.host.contract import HangAnswer, LogRead
from pipeline.host.probe import JobProbe, LogChunk
from pipeline.host.probe import ProbeEntry as Entry  # (job name, its config, its current record or None)
from pipeline.host.remote import RemoteHosts
from pipeline.observe.evidence import Observation, count_right
from pipeline.state.runs import RunRecord

__all__ = ["CancelCheck", "Engine", "Entry", "NodeOutputs", "Observation", "Sighting", "StepListener"]

Reads = Mapping[str, LogRead]
"""Job name → a file range to read in the same look (the watcher's metric-log bytes)."""


@dataclass(frozen=True)
class Sighting:
    """One job as its engine sees it in a look at many jobs at once (watch, status, recovery)."""

    probe: JobProbe  #: processes, output size and clock; ``error`` set when the job could not be seen
    expected: int  #: processes the job should have
    state: str = "none"  #: ``alive``, ``pending``, ``gone``, ``stale`` or ``none`` (nothing recorded)
    pid: int | None = None
    job_id: int | None = None
    word: str | None = None  #: the state in the status table (``running``…); None: from the count
    who: str | None = None  #: the identity cell in the status table (``job 12``); None: the pid
    uptime_s: float | None = None  #: seconds run, when the engine knows (else from the launch time)
    line: str | None = None  #: a line shown under the status table (nodes, pending reason)
    exit_cause: str | None = None  #: how the run ended, when it no longer runs
    detail: str | None = None  #: where the count falls short (kept as an incident's cause)
    ok: bool | None = None  #: whether the job is as it should be, when the engine judges it itself
    #: how the scheduler says it ended (Slurm's ``PREEMPTED``, ``TIMEOUT``, ``FAILED``…), its own
    #: exit code, and the nodes it ran on, in rank order: what the crash check cannot read in its log
    end_state: str | None = None
    exit_code: int | None = None
    nodes: tuple[str, ...] = ()
    restarts: int = 0  #: how many times the scheduler requeued the job (Slurm's ``Restarts``)
    requeued: str | None = None  #: with ``restarts``: the post telling the last requeue
    requeue_cause: str = ""  #: why the scheduler requeued it (``preempted by job 13 (partition high) on n1``)

    @property
    def healthy(self) -> bool:
        """The engine's ``ok`` when it says, else: seen, with the expected processes, nothing short
        (:func:`~pipeline.observe.evidence.count_right`, verify's rule)."""
        if self.ok is not None:
            return self.ok
        return self.probe.error is None and count_right(self.probe.count, self.expected, self.detail)


@dataclass(frozen=True)
class NodeOutputs:
    """A command's output on every node of a job's run."""

    who: str  #: how the engine names the run (``Slurm job 12``)
    outputs: Mapping[str, str]  #: node name → the command's standard output there


@dataclass(frozen=True)
class Target:
    """One configured job as its engine acts on it or looks at it."""

    name: str  #: its configured name
    job: JobConfig
    current: Mapping[str, str]  #: its ``keys.job_current`` record (empty when none)


@dataclass(frozen=True)
class Plan:
    """What a start or restart is to do before its launch: a start's plan is ``Plan(start=True)``, a
    restart's says what it does to the job's patches (:func:`~pipeline.engines.workdir.patch_plan`)."""

    texts: Mapping[str, str] = field(default_factory=dict)  #: every configured patch's text, by name
    #: patch name → ``state`` (only looked at), ``apply`` or ``revert``: what pre-flight checks
    wants: Mapping[str, str] = field(default_factory=dict)
    add: Sequence[str] = ()  #: patch names to apply
    remove: Sequence[str] = ()  #: patch names to revert
    start: bool = False  #: a start: pre-flight refuses a job whose recorded run still runs


class Engine(Protocol):
    """The steps and looks that differ between engines; everything else is the runner's.

    Each step begins and ends its record through the :class:`~pipeline.engines.steplog.StepLog`
    the engine was built with and raises a :class:`~pipeline.errors.SequenceAborted` error when
    it fails.  Looks raise :class:`~pipeline.errors.RemoteError` when the job cannot be seen.
    """

    async def preflight(self, run: RunRecord, t: Target, plan: Plan) -> Mapping[str, bool]:
        """Check everything before anything is touched (``plan.wants``); refuse a start
        (``plan.start``) if the run recorded in ``t.current`` still runs.

        :returns: which configured patches are applied now.
        """

    async def stop(self, run: RunRecord, t: Target) -> None:
        """Stop the old run recorded in ``t.current`` (by its identity, never by pattern); record on
        ``run`` which old run it replaces (pid, job id)."""

    async def clear_cache(self, run: RunRecord, t: Target) -> None:
        """The ``clear_cache`` step: empty the job's ``clear_cache`` paths when ``run.fresh_cache``,
        else SKIPPED.

        :raises LaunchFailed: if a path cannot be cleared.
        """

    async def patch(self, run: RunRecord, t: Target, plan: Plan, applied: Mapping[str, bool]) -> None:
        """The ``patch`` step: apply ``plan.add`` and revert ``plan.remove`` in the job's workdir;
        ``applied`` is what pre-flight found in effect; records the patches in effect
        (``run.patches``, ``StepLog.records.store_patches``).

        :raises LaunchFailed: if a patch does not apply.
        """

    async def read_chunk(self, name: str, job: JobConfig, offset: int, length: int, *, path: str) -> LogChunk:
        """Up to ``length`` bytes of the job's file ``path`` (its metric log) from byte ``offset``
        (negative: from the end), as :func:`pipeline.host.probe.read_log_chunk` reads them (a
        :class:`~pipeline.host.probe.ChunkReader`: the metric-log offset at launch, attempts).

        :raises PitstopError: if the file cannot be read (a missing one may read as empty).
        """

    async def patches_applied(self, name: str, job: JobConfig, texts: Mapping[str, str]) -> list[str]:
        """The names of ``texts`` (patch name → text) applied in the job's workdir now, sorted.

        :raises RemoteError: if the workdir cannot be looked at.
        """

    async def launch(self, run: RunRecord, t: Target) -> None:
        """Launch the new run; returns at once, its identity recorded (``StepLog.records.record_launch``)."""

    async def observe(self, run: RunRecord, t: Target, *, complete: bool) -> Observation:
        """One sample of the launched ``run``; ``complete=False`` may return the state alone."""

    async def observe_many(self, entries: Sequence[Entry], reads: Reads | None = None) -> dict[str, Sighting]:
        """Every job of ``entries`` (all on one host or cluster) in one look; never raises: a job
        that could not be seen has ``probe.error`` set.  Optional for an engine (None: the watcher
        does it): ``reads`` in ``probe.read``/``probe.read_error``, and for a job short of
        processes its output's last lines and exit record in ``probe.tail``/``probe.exit_status``."""

    async def log_tail(self, t: Target, lines: int) -> str:
        """The last ``lines`` lines of the job's output (``logs``)."""

    async def node_outputs(self, t: Target, argv: Sequence[str]) -> NodeOutputs | None:
        """``argv`` run on every node the job's run holds now (``gpus JOB``); None when the job
        holds no nodes of its own (``gpus HOST`` asks its host).

        :raises PitstopError: if the run holds no nodes now (the message says why).
        """

    async def crash_evidence(self, t: Target, offset: int, seen: JobProbe | None) -> JobProbe:
        """What the dead run left (the crash check): ``state``, ``exit_status``, ``log_size`` and
        ``crash``, the last :data:`~pipeline.host.probe.CRASH_BYTES` of its output since byte
        ``offset``; what ``seen`` (the watch cycle's sighting) already brought is kept.

        :raises PitstopError: if the output cannot be read.
        """

    async def hang_evidence(self, t: Target, pids: Sequence[int]) -> HangAnswer:
        """State, ``wchan`` and Python stacks of the run's processes (only ``pids`` when given).

        :raises PitstopError: if they cannot be looked at (the message says why).
        """


class EngineKind(Protocol):
    """An engine as a registry holds it (its class): it builds the engine and checks a job's config
    for it, its own table included (``[jobs.NAME.slurm]``)."""

    def __call__(self, ssh: RemoteHosts, steps: StepLog) -> Engine:
        """The engine, over the SSH pool and the step log every engine records through."""

    def check(self, job: JobConfig, at: str) -> list[str]:
        """What is wrong with ``job`` (the table at TOML path ``at``: ``jobs.NAME``) for this engine,
        one line per problem naming its key; [] when nothing."""


def check_engines(config: Config, engines: Mapping[str, EngineKind]) -> None:
    """Check every job's ``engine``: a name in ``engines`` (name → kind), and a job that suits it
    (:meth:`EngineKind.check`).

    :raises ConfigError: one line per problem (``jobs.j.engine: unknown engine 'k8s': use one of
        "slurm", "ssh"``).
    """
    known = ", ".join(f'"{n}"' for n in sorted(engines))
    problems = []
    for name, job in config.jobs.items():
        kind = engines.get(job.engine)
        if kind is None:
            problems.append(f"jobs.{name}.engine: unknown engine {job.engine!r}: use one of {known}")
        else:
            problems += kind.check(job, f"jobs.{name}")
    if problems:
        raise ConfigError(problems, config.source)
