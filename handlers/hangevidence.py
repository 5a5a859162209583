"""Evidence for a hang, attached to a stuck-rank or stalled incident's thread.

What a person would run by hand on the host, done once when the incident opens (one look by the
job's engine, :meth:`~pipeline.engines.base.RestartService.hang_evidence`): each stuck process's state and ``wchan`` from ``/proc``, and its Python stacks from
``py-spy dump --pid PID`` when py-spy is installed there (when it is not, the post says so, with the
install line).  A process in uninterruptible sleep (``D``) cannot be killed, so the post says a
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


async def hang_evidence(ctx: Context, inc: Incident) -> Reply | None:
    """The thread post with the hang evidence of ``inc``'s job (the stuck rank's process, or all).

    :param ctx: the process context.
    :param inc: a stuck-rank or stalled incident (numbered).
    :returns: the reply, or None if the host could not be asked (logged).
    """
    pids = [inc.rank_pid] if inc.kind is IncidentKind.STUCK_RANK and inc.rank_pid is not None else []
    try:
        answer = await ctx.restarter.hang_evidence(inc.job, pids)
    except PitstopError as exc:
        log.warning("hang evidence for %s: %s", inc.job, exc.message)
        return None
    return hang_reply(inc, answer)


def hang_reply(inc: Incident, answer: HangAnswer) -> Reply:
    """The post from the helper's ``hang`` answer (pure; see :func:`hang_evidence`)."""
    procs = answer.get("processes") or []
    who = f"rank {inc.rank}" if inc.kind is IncidentKind.STUCK_RANK and inc.rank is not None else inc.job
    lines: list[str] = []
    stacks: list[str] = []
    unkillable = False
    for p in procs:
        lines.append(_process(p["pid"], p.get("cmdline") or "", p.get("state"), p.get("wchan")))
        unkillable |= p.get("state") == "D"
        stack, stack_error = p.get("stack"), p.get("stack_error")
        if stack:
            stacks.append(_stack_title(p["pid"]) + "\n" + stack)
        elif stack_error:
            lines.append(_py_spy_failed(p["pid"], stack_error))
    if not procs:
        lines.append(_no_process(inc.job))
    if answer.get("py_spy") is None:
        lines.append(_py_spy_missing(inc.host))
    if unkillable:
        lines.append(_unkillable(who))
    return Reply(
        title=_title(who, len(procs)),
        status=Status.ERROR if unkillable else Status.WARNING,
        lines=tuple(lines),
        log="\n\n".join(stacks) or None,
        log_title=HANG_STACKS_TITLE if stacks else "",
        thread_key=inc.thread_key,
    )


# --- the words of this post (they belong to this reply alone) ---------------------------------------

_STATES = {"R": "running", "S": "sleeping", "D": "uninterruptible sleep", "T": "stopped", "Z": "zombie"}


def _title(who: str, count: int) -> str:
    return f"hang evidence for {who}: {count} process{'es' if count != 1 else ''} on the host"


def _process(pid: int, cmdline: str, state: str | None, wchan: str | None) -> str:
    what = f"{state} ({_STATES.get(state, '?')})" if state else "gone"
    return f"pid {pid} `{cmdline}`: state {what}, wchan {wchan or '-'}"


def _stack_title(pid: int) -> str:
    return f"py-spy dump --pid {pid}"


def _py_spy_failed(pid: int, error: str) -> str:
    return f"py-spy dump --pid {pid} failed: {error}"


def _py_spy_missing(host: str) -> str:
    return f"py-spy is not installed on {host}, so no Python stacks: `pip install py-spy` there"


def _no_process(job: str) -> str:
    return f"no process of {job} found on the host"


def _unkillable(who: str) -> str:
    return f"a process in uninterruptible sleep (D) cannot be killed: a restart will not free {who}; the host may need recycling"


__all__ = ["KINDS", "hang_evidence", "hang_reply"]
