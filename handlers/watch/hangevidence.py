"""Evidence for a hang, posted in a stuck-rank or stalled incident's thread once it opens.

What a person would run by hand on the host, in one look by the job's engine
(:meth:`~pipeline.engines.runner.Runner.hang_evidence`): each stuck process's state and
``wchan`` from ``/proc``, and its Python stacks from ``py-spy dump --pid PID`` when py-spy is
installed there.  A process in uninterruptible sleep (``D``) cannot be killed, so the post says a
restart will not free it and the host may need recycling.
"""

from __future__ import annotations

import logging

from handlers.context import Context
from handlers.reply import Reply, Status
from handlers.text import HANG_STACKS_TITLE
from pipeline.errors import PitstopError
from pipeline.host.contract import HangAnswer
from pipeline.state.incidents import Incident, IncidentKind

log = logging.getLogger(__name__)

KINDS = (IncidentKind.STUCK_RANK, IncidentKind.STALLED)  #: incidents that get hang evidence
_STATES = {"R": "running", "S": "sleeping", "D": "uninterruptible sleep", "T": "stopped", "Z": "zombie"}


async def post_hang_evidence(ctx: Context, inc: Incident, channel: str | None) -> None:
    """Post the hang evidence of ``inc``'s job (the stuck rank's process, or all) in its thread, if
    it is a stuck-rank or stalled incident (:data:`KINDS`) and the host could be asked (else logged).

    :param inc: a numbered incident.
    :param channel: its job's channel (None: the announce channel).
    """
    if inc.kind not in KINDS:
        return
    pids = [inc.rank_pid] if inc.kind is IncidentKind.STUCK_RANK and inc.rank_pid is not None else []
    try:
        answer = await ctx.restarter.hang_evidence(inc.job, pids)
    except PitstopError as exc:
        log.warning("hang evidence for %s: %s", inc.job, exc.message)
        return
    await ctx.outbox.thread(inc.thread_key, hang_reply(inc, answer), channel)


def hang_reply(inc: Incident, answer: HangAnswer) -> Reply:
    """The post from the helper's ``hang`` answer (pure; see :func:`post_hang_evidence`)."""
    procs = answer.get("processes") or []
    who = f"rank {inc.rank}" if inc.kind is IncidentKind.STUCK_RANK and inc.rank is not None else inc.job
    lines: list[str] = []
    stacks: list[str] = []
    unkillable = False
    for p in procs:
        pid, state, stack, stack_error = p["pid"], p.get("state"), p.get("stack"), p.get("stack_error")
        what = f"{state} ({_STATES.get(state, '?')})" if state else "gone"
        lines.append(f"pid {pid} `{p.get('cmdline') or ''}`: state {what}, wchan {p.get('wchan') or '-'}")
        unkillable |= state == "D"
        if stack:
            stacks.append(f"py-spy dump --pid {pid}\n{stack}")
        elif stack_error:
            lines.append(f"py-spy dump --pid {pid} failed: {stack_error}")
    if not procs:
        lines.append(f"no process of {inc.job} found on the host")
    if answer.get("py_spy") is None:
        lines.append(
            f"py-spy is not installed on {inc.host}, so no Python stacks: `pip install py-spy` there"
        )
    if unkillable:
        lines.append(
            f"a process in uninterruptible sleep (D) cannot be killed: a restart will not free {who}; "
            "the host may need recycling"
        )
    return Reply(
        title=f"hang evidence for {who}: {len(procs)} process{'es' if len(procs) != 1 else ''} on the host",
        status=Status.ERROR if unkillable else Status.WARNING,
        lines=tuple(lines),
        log="\n\n".join(stacks) or None,
        log_title=HANG_STACKS_TITLE if stacks else "",
        thread_key=inc.thread_key,
    )
