"""Slurm's own requeues read from its records (``scontrol``'s ``Restarts``, ``sacct -D``'s earlier
runs) and told as people read them: why, when, and what the job is now."""

from __future__ import annotations

from pipeline.host.slurm import Requeue, parse_query, requeued_line

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
