"""Slurm's own requeues read from its records (``scontrol``'s ``Restarts``, ``sacct -D``'s earlier
runs) or, without accounting, from what the cluster still shows (the job now on the nodes it ran
on, their state), told as people read them: why, when, and what the job is now; one that stays
PENDING past ``pending_after`` is an incident."""

from __future__ import annotations

from handlers.watch.alerts import alert_reply
from pipeline.config import Config, HostConfig, JobConfig
from pipeline.config.jobs import AutoRestart, WatchSettings
from pipeline.host.slurm import Requeue, parse_query, requeue_cause, requeued_line
from pipeline.observe.watch import ActionKind, Observation, Situation, assess
from pipeline.state.incidents import IncidentKind, WatchState

#: a ``_QUERY`` answer for job 12, preempted once and PENDING again (recorded from Slurm 22.05's
#: ``squeue``, ``scontrol show job -o`` and ``sacct -D``), and job 13, never requeued, finished
ANSWER = """\
12|PENDING|2||BeginTime|0:00
@@scontrol
JobId=12 JobName=dflash UserId=root(0) JobState=PENDING Reason=BeginTime Dependency=(null) Requeue=1 Restarts=1 BatchFlag=1 RunTime=00:00:00 NodeList= NumNodes=2 StdOut=/srv/dflash/slurm-12.out ExitCode=0:0
JobId=13 JobName=x JobState=COMPLETED Reason=None Restarts=0 RunTime=00:00:05 NodeList=n3 NumNodes=1 ExitCode=0:0
@@sacct
12|PENDING|0:0|BeginTime|2|None assigned
13|COMPLETED|0:0|None|1|n3
@@requeues
12|PREEMPTED|2024-05-01T12:00:03|n[1-2]
12|PENDING|Unknown|None assigned
13|COMPLETED|2024-05-01T12:01:00|n3
@@reads
"""


def test_a_requeue_is_read_from_slurms_records() -> None:
    """The earlier run's state, end and nodes, as many as ``Restarts`` says; none for a job never requeued."""
    jobs = parse_query(ANSWER)
    assert (jobs[12].restarts, jobs[12].requeues) == (
        1,
        (Requeue("PREEMPTED", "2024-05-01T12:00:03", ("n1", "n2")),),
    )
    assert (jobs[13].restarts, jobs[13].requeues) == (0, ())  # its own end is no requeue


def test_the_requeue_post_says_why_when_and_what_now() -> None:
    """Preempted, a node failure and an admin's requeue, PENDING with its reason or RUNNING again."""
    assert requeued_line("dflash", parse_query(ANSWER)[12]) == (
        "requeued: dflash (Slurm job 12, restart 1): preempted on n1, n2 at 2024-05-01T12:00:03 "
        "(Slurm: PREEMPTED); now PENDING, reason BeginTime"
    )
    failed = ANSWER.replace("PREEMPTED", "NODE_FAIL").replace("n[1-2]", "n2")
    assert "node n2 failed at 2024-05-01T12:00:03 (Slurm: NODE_FAIL)" in requeued_line(
        "dflash", parse_query(failed)[12]
    )
    running = ANSWER.replace("12|PENDING|2||BeginTime|0:00", "12|RUNNING|2|n[1,3]|None|0:04").replace(
        "PREEMPTED", "REQUEUED"
    )
    assert requeued_line("dflash", parse_query(running)[12]).endswith(
        "requeued by an admin on n1, n2 at 2024-05-01T12:00:03 (Slurm: REQUEUED); now RUNNING on n1, n3"
    )


#: a ``_WHY`` answer recorded from the test cluster (Slurm 22.05, no accounting) 2 s after job 12 of
#: ``low`` (last seen on n1, n2 from 12:00:03) was requeued: job 14 of ``high`` runs on n1 since
#: 12:05:10, job 9 of ``debug`` on n2 since before; ``sinfo`` lists a node once per partition
WHY = """\
14|high|2024-05-01T12:05:10|n1
9|debug|2024-05-01T11:00:00|n2
@@tiers
debug|1
low|1
high|10
@@nodes
n1|allocated
n1|allocated
n2|mixed
n3|idle
"""
REQUEUED = parse_query(
    ANSWER.replace("Restarts=1", "Partition=low SubmitTime=2024-05-01T12:05:11 Restarts=1")
    .replace("@@requeues\n12|PREEMPTED|2024-05-01T12:00:03|n[1-2]\n", "@@requeues\n")
    .replace("@@sacct\n", "@@sacct-absent\n")
)[12]


def test_without_accounting_a_preemptor_is_the_higher_tier_job_now_on_its_nodes() -> None:
    """Job 14 of a higher tier started on n1 after job 12 did: preempted by it; a job of the same
    or a lower tier, one started before, or one elsewhere is not the preemptor."""
    assert (REQUEUED.partition, REQUEUED.submitted, REQUEUED.requeues) == ("low", "2024-05-01T12:05:11", ())
    since = "2024-05-01T12:00:03"
    assert requeue_cause(WHY, REQUEUED, ("n1", "n2"), since) == "preempted by job 14 (partition high) on n1"
    assert requeue_cause(WHY, REQUEUED, ("n2", "n3"), since) is None  # job 9 of debug: the same tier
    assert requeue_cause(WHY, REQUEUED, ("n1",), "2024-05-01T12:06:00") is None  # started before it
    line = requeued_line("dflash", REQUEUED, requeue_cause(WHY, REQUEUED, ("n1", "n2"), since))
    assert line == (
        "requeued: dflash (Slurm job 12, restart 1): preempted by job 14 (partition high) on n1 "
        "at 2024-05-01T12:05:11; now PENDING, reason BeginTime"
    )


def test_without_accounting_a_failed_node_or_nothing_says_so() -> None:
    """A node it ran on down or not responding (``*``): node failed; nothing found: by an admin or Slurm."""
    down = WHY.replace("n2|mixed", "n2|down*").replace("14|high", "14|debug")
    assert requeue_cause(down, REQUEUED, ("n1", "n2"), "") == "node n2 failed"
    assert requeue_cause(WHY.replace("n3|idle", "n3|idle*"), REQUEUED, ("n3",), "") == "node n3 failed"
    assert requeued_line("dflash", REQUEUED).startswith(
        "requeued: dflash (Slurm job 12, restart 1): requeued by an admin or by Slurm at 2024-05-01T12:05:11;"
    )


def test_a_preemption_under_way_is_read_from_preempt_time() -> None:
    """``PreemptTime`` set: the job is being preempted; ``None``: it is not."""
    assert not parse_query(ANSWER)[13].preempting
    being = ANSWER.replace("JobId=13 JobName=x", "JobId=13 PreemptTime=2024-05-01T12:00:01 JobName=x")
    assert parse_query(being)[13].preempting


T0 = 1_700_000_000.0


def _queued(t: float, queued_for: float | None, count: int = 0) -> tuple[Observation, Situation]:
    """An observation at ``T0 + t`` and the situation of a job requeued ``queued_for`` s ago."""
    obs = Observation(at=T0 + t, count=count, pids=tuple(range(100, 100 + count)), log_size=int(t) + 1)
    reason = "dflash: Slurm job 12 PENDING on 2 nodes, reason Resources" if queued_for is not None else None
    return obs, Situation(in_flight=True, running_verdict=True, queued_for=queued_for, pending_reason=reason)


def test_a_requeued_job_pending_past_pending_after_is_one_incident_resolved_when_it_runs() -> None:
    """In flight until ``pending_after`` (no dead alert, no automatic restart), then one ``queued``
    incident with the pending reason, reminded not reopened, resolved once it runs again."""
    cfg = JobConfig(
        host="login",
        workdir="/w",
        launch=["./run.sh"],
        log="/w/train.log",
        match="worker",
        processes=8,
        watch=WatchSettings(pending_after=600, auto_restart=AutoRestart(max=3, backoff=0.001)),
    )
    state, incident, seen = WatchState(), None, []
    for obs, situation in [
        _queued(0, 0),
        _queued(599, 599),
        _queued(600, 600),
        _queued(700, 700),
        _queued(701, None, 8),
    ]:
        d = assess("dflash", cfg, obs, state, incident, situation)
        state, incident = d.state, d.incident
        seen.append((d.condition, [(a.kind, a.incident.kind) for a in d.actions]))
    assert seen == [
        ("in_flight", []),
        ("in_flight", []),
        ("queued", [(ActionKind.OPEN, IncidentKind.QUEUED)]),
        ("queued", []),
        ("in_flight", [(ActionKind.RESOLVE, IncidentKind.QUEUED)]),
    ]
    obs, situation = _queued(600, 600)
    [first] = [a.incident for a in assess("dflash", cfg, obs, WatchState(), None, situation).actions]
    assert (
        first.cause == "dflash: Slurm job 12 PENDING on 2 nodes, reason Resources"
        and first.auto_restarts == 0
    )
    assert alert_reply(
        first, Config(hosts={"login": HostConfig(address="127.0.0.1")}, jobs={"dflash": cfg}), now=T0
    ).title.startswith("dflash is still queued since the scheduler requeued it")
