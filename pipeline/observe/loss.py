"""Loss health: a NaN or infinite loss, and a loss spike, from the metric lines' ``loss``.

Each watch cycle folds the job's new metric lines into a :class:`LossState` (kept in its
:class:`~pipeline.observe.progress.ProgressState`: a new run starts afresh), per rank:

- **NaN** (``loss_nan``): a line whose ``loss`` is NaN or ±Inf (JSON ``NaN``/``Infinity`` as
  Python's json writes them, or the strings ``"nan"``/``"inf"``); the rank's first such step is
  kept until it logs a finite loss again;
- **spike** (``loss_spike``): a finite loss above ``[jobs.NAME.watch] loss_spike`` (default 3) ×
  the median of the rank's finite losses logged in the ``loss_window`` steps before it (at least
  :data:`MIN_BASELINE` of them, their median above 0) at every line from step S on, the last one
  ``loss_spike_steps`` or more steps from S (S counted).

:func:`trouble` (pure) names the one to report: a NaN first, else the spike; the earliest first
step, then the lowest rank.  :func:`checkpoint_before` finds the checkpoint to roll back to.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict

from pipeline.config import JobConfig
from pipeline.config.jobs import WatchSettings
from pipeline.host.remote import RemoteHosts
from pipeline.observe.checkpoints import list_checkpoints
from pipeline.observe.metrics import MetricLine
from pipeline.state.incidents import IncidentKind

MIN_BASELINE = 5  #: finite losses a rank must have logged in the window before a line to judge a spike


class RankLoss(BaseModel):
    """One rank's losses (steps as it logged them)."""

    model_config = ConfigDict(extra="ignore")

    role: str = "worker"
    step: int | None = None  #: the last step it logged a loss at
    recent: list[
        tuple[int, float]
    ] = []  #: (step, loss) of its finite losses in the last ``loss_window`` steps
    value: str | None = None  #: its last loss as shown (``NaN``, ``-Inf``, ``41.3``)
    bad_since: int | None = None  #: the first step of its current run of NaN or infinite losses
    over_since: int | None = None  #: the first step of its current run of losses above the spike bound
    median: float | None = None  #: the rolling median that run was measured against (at its start)


class LossState(BaseModel):
    """A job's losses between cycles, by rank (as a string)."""

    model_config = ConfigDict(extra="ignore")

    ranks: dict[str, RankLoss] = {}

    def ingest(self, lines: Iterable[MetricLine], watch: WatchSettings) -> LossState:
        """The copy with ``lines`` (in file order) folded in; a line without a step or a loss, or at
        a step its rank already logged, is left out."""
        ranks = {k: v.model_copy(deep=True) for k, v in self.ranks.items()}
        for line in lines:
            loss, bad = line.loss, line.loss_not_finite
            if line.step is None or (loss is None and bad is None):
                continue
            r = ranks.setdefault(str(line.rank), RankLoss(role=line.role))
            if r.step is not None and line.step <= r.step:
                continue
            r.step, r.role = line.step, line.role
            if loss is None:  # NaN or infinite
                r.value, r.over_since, r.median = bad, None, None
                r.bad_since = r.bad_since if r.bad_since is not None else line.step
                continue
            recent = [(s, v) for s, v in r.recent if s > line.step - watch.loss_window]
            base = statistics.median(v for _, v in recent) if len(recent) >= MIN_BASELINE else None
            if base is not None and base > 0 and loss > watch.loss_spike * base:
                if r.over_since is None:
                    r.over_since, r.median = line.step, base
            else:
                r.over_since = r.median = None
            r.recent, r.value, r.bad_since = [*recent, (line.step, loss)], loss_text(loss), None
        return LossState(ranks=ranks)


@dataclass(frozen=True)
class LossTrouble:
    """What is wrong with a job's loss now."""

    kind: IncidentKind  #: ``LOSS_NAN`` or ``LOSS_SPIKE``
    rank: int  #: the rank named (the earliest trouble, then the lowest rank)
    role: str
    since: int  #: the first step of the trouble
    step: int  #: the rank's last step logged
    value: str  #: its last loss as shown (``NaN``, ``Inf``, ``41.3``)
    median: float | None = None  #: a spike: the rolling median it is measured against
    others: tuple[int, ...] = ()  #: other ranks in the same trouble


def trouble(state: LossState, watch: WatchSettings) -> LossTrouble | None:
    """The loss trouble to report (module docstring), or None when every rank's loss is healthy."""
    ranks = sorted((int(k), r) for k, r in state.ranks.items())
    nan = [(r.bad_since, rank, r) for rank, r in ranks if r.bad_since is not None]
    spiked = [
        (r.over_since, rank, r)
        for rank, r in ranks
        if r.over_since is not None and (r.step or 0) - r.over_since + 1 >= watch.loss_spike_steps
    ]
    kind, hits = (IncidentKind.LOSS_NAN, nan) if nan else (IncidentKind.LOSS_SPIKE, spiked)
    if not hits:
        return None
    since, rank, r = min(hits, key=lambda hit: (hit[0], hit[1]))
    others = tuple(other for _, other, _ in hits if other != rank)
    return LossTrouble(kind, rank, r.role, since, r.step or since, r.value or "?", r.median, others)


async def checkpoint_before(ssh: RemoteHosts, name: str, job: JobConfig, step: int) -> int | None:
    """The step of the newest intact checkpoint of job ``name`` written before ``step`` (where its
    trouble began): the one to roll back to with ``restart JOB from step S``.  The one place that looks.

    The host lists the ``step-NNNNNN`` checkpoints in ``checkpoint_dir``, each checked against its
    manifest (:func:`pipeline.observe.checkpoints.list_checkpoints`).

    :returns: the step, or None: no ``checkpoint_dir``, or no intact checkpoint before ``step``.
    :raises RemoteError: if the host cannot be asked.
    """
    found = await list_checkpoints(ssh, name, job)
    return next((c.step for c in found if c.intact and c.step < step), None)


# --- text ---------------------------------------------------------------------------------------


def loss_text(loss: float) -> str:
    """A loss as shown: 4 significant digits (``41.33``, ``0.0123``)."""
    return f"{loss:.4g}"


def loss_facts(found: LossTrouble, watch: WatchSettings) -> dict[str, Any]:
    """The incident fields ``rank``, ``rank_role``, ``loss_step``, ``loss_value`` of ``found`` and its
    ``cause`` line: ``loss NaN on rank 1 (drafter) since step 40 (last logged: step 45)``, or
    ``loss 41.3 on rank 1 (drafter) above 3 × its median 4.12 over 200 steps since step 60 (11 steps)``."""
    who = f"loss {found.value} on rank {found.rank} ({found.role})"
    if found.kind is IncidentKind.LOSS_NAN:
        cause = f"{who} since step {found.since} (last logged: step {found.step})"
    else:
        median = loss_text(found.median) if found.median is not None else "?"
        above = f"above {watch.loss_spike:g} × its median {median} over {watch.loss_window} steps"
        cause = f"{who} {above} since step {found.since} ({found.step - found.since + 1} steps)"
    if found.others:
        cause += f"; also ranks {', '.join(map(str, found.others))}"
    return dict(
        rank=found.rank, rank_role=found.role, loss_step=found.since, loss_value=found.value, cause=cause
    )
