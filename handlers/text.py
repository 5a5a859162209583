"""The words a person reads from ``handlers/``, in one catalogue (as Bolt's ``logger/messages.py``):
constants for fixed words, small functions where words take values.

A leaf of ``handlers``: it imports no module of ``handlers`` (every one of them may import it), only
:mod:`pipeline.fmt` and the pipeline types its words are built from.  Replies, tables and the
choices between words that need real logic stay in the module of the verb that answers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING

from pipeline import fmt
from pipeline.config.jobs import APPROVER_ROLES
from pipeline.digest.goodput import incident_cost
from pipeline.state.incidents import IncidentKind

if TYPE_CHECKING:  # types only: ``pitstop parse`` (the grammar reads these words) stays quick
    from pipeline.config import AutoRestart
    from pipeline.observe.attempts import TrainingProgress
    from pipeline.state.approvals import ApprovalRequest
    from pipeline.state.audit import Actor
    from pipeline.state.incidents import Incident
    from pipeline.state.runs import RunRecord

#: an alert whose log tail could not be read
ALERT_NO_LOG = "the log could not be read"
#: an alert's "last seen alive" when the watcher never saw the job alive
ALERT_NEVER_SEEN = "not seen by the watcher"
#: labels of an alert's fields, by field id
ALERT_FIELD_LABELS = MappingProxyType(
    {
        "job": "job",
        "host": "host",
        "processes": "processes",
        "last_pid": "last PID",
        "last_alive": "last seen alive",
        "exit": "exit cause",
        "error": "connection error",
        "opened": "since",
        "acked": "acknowledged by",
        "auto": "automatic restarts",
    }
)
#: a new alert's headline by incident kind (fields: job, host, procs, expected, idle, and for a
#: loss incident loss, rank, step; else kind)
ALERT_TITLES = {
    IncidentKind.DEAD: "{job} is down: no processes left on {host} (expected {expected})",
    IncidentKind.DEGRADED: "{job} is degraded: {procs} processes on {host}",
    IncidentKind.STALLED: "{job} has stalled: alive ({procs}) but no new log output{idle}",
    IncidentKind.STUCK_RANK: "{job} has a stuck rank on {host}: one rank stopped advancing while the others wait",
    IncidentKind.UNREACHABLE: "host {host} unreachable - cannot check {job}",
    IncidentKind.CRASH_LOOP: "{job} is crash-looping on {host} - automatic restarts given up",
    IncidentKind.IDLE_GPUS: "{job} has idle GPUs on {host}: alive ({procs}) but GPUs it holds are not working",
    IncidentKind.LOSS_NAN: "{job} is training on garbage: its loss is {loss} on rank {rank} since step {step}",
    IncidentKind.LOSS_SPIKE: "{job}'s loss spiked: {loss} on rank {rank} since step {step}",
    IncidentKind.QUEUED: "{job} is still queued since the scheduler requeued it: nothing runs (expected {expected})",
}
#: how a resolved incident's headline says what the job was, by incident kind (else "was KIND")
ALERT_WAS = {
    "dead": "was down",
    "stuck_rank": "had a stuck rank",
    "crash_loop": "was crash-looping",
    "idle_gpus": "had idle GPUs",
    "loss_nan": "had a NaN or infinite loss",
    "loss_spike": "had a loss spike",
    "queued": "was queued after its requeue",
}
#: the label of a failed run's show-log button
SHOW_LOG_BUTTON = "Show log"
#: the caption of the Python stacks under hang evidence
HANG_STACKS_TITLE = "Python stacks (py-spy dump)"
#: the labels of an approval request's buttons (the two-person rule)
APPROVE_BUTTON = "Approve"
DENY_BUTTON = "Deny"
HASH_SHOWN = 12  #: hex digits of a SHA-256 shown in text (the whole hash is in the record)
#: ``history --attempts`` without a job
ATTEMPTS_NEED_JOB = "history --attempts needs a job: `history dflash --attempts`"
#: the labels of a confirmation's buttons
CONFIRM_BUTTON = "Confirm"
CANCEL_BUTTON = "Cancel"
#: a click on a confirmation that no longer exists
CONFIRM_GONE = "this confirmation has expired or was already answered - nothing was done"
#: ``digest`` with no jobs configured
DIGEST_NO_JOBS = "no jobs are configured - nothing to digest"
#: ``gpus HOST`` when no compute process holds GPU memory
GPUS_NO_PROCESSES = "no processes hold GPU memory"
#: ``status`` with no jobs configured
STATUS_NONE = "no jobs configured - add a [jobs.NAME] table to the config"
#: the headings of the refused and the two-person rule's parts of ``history``
HISTORY_REFUSALS_TITLE = "recent denied, refused and failed requests"
HISTORY_APPROVALS_TITLE = "two-person rule: requests, approvals, denials, expiries and break glass"
#: marks a run an admin started without approval
HISTORY_BREAK_GLASS = "break glass"
#: field labels of ``patches JOB`` (sha256: each patch file's first 12 hex digits now) and ``lock JOB``
FIELD_SHA256 = "sha256"
FIELD_AVAILABLE = "available"
FIELD_IN_EFFECT = "in effect"
FIELD_RUN = "run"
FIELD_SINCE = "since"
#: a finished run without a verdict (a stop that succeeded), a launched one whose verification is not due yet
RUN_DONE = "done"
RUN_AWAITING_VERDICT = "launched, awaiting verdict"
#: the columns of the ``status`` table, and of ``history``'s runs, approvals and refused-requests tables
STATUS_HEADERS = ("job", "state", "pid", "procs", "uptime", "last restart", "lock", "patches")
HISTORY_HEADERS = ("run", "when", "who", "action", "patches", "verdict", "took")
HISTORY_APPROVAL_HEADERS = ("when", "run", "who", "outcome", "what")
#: the columns of ``history JOB --attempts``
CHECKPOINT_HEADERS = ("step", "written", "size", "files", "state")
ATTEMPT_HEADERS = ("run", "started", "resumed at", "reached", "steps/s", "ended", "steps lost")
HISTORY_REFUSAL_HEADERS = ("when", "who", "request", "outcome", "why")
#: a repeated delivery of a request that was already acted on
DUPLICATE_DELIVERY = "already handled (a repeated delivery of the same request) - nothing was done again"
#: the heading of ``help``
HELP_TITLE = "Pitstop commands"
#: a grouped post's headline once the last of its jobs resolved on its own
STORY_ALL_RESOLVED = "resolved: every job of this alert has recovered (each job's line says when)"


# --- people, as every surface reads them


def mention(target: str) -> str:
    """A person (``U…``/``W…`` → ``<@U…>``), a user group (``S…`` → ``<!subteam^S…>``) or a broadcast
    (``here`` → ``<!here>`` …) in Slack's markup, which every surface reads; anything else as it is."""
    t = target.strip().lstrip("@")
    if t in ("here", "channel", "everyone"):
        return f"<!{t}>"
    if t.startswith("S"):
        return f"<!subteam^{t}>"
    if t.startswith(("U", "W")):
        return f"<@{t}>"
    return t


# --- a request's way: the dispatcher, confirmations, roles, the verb table


def unknown_action(action: str) -> str:
    """A button whose action Pitstop does not know."""
    return f"unknown action {action!r} - nothing was done"


def confirm_ask(text: str, job: str, seconds: float) -> str:
    """A job configured with ``confirm = true`` asks before acting."""
    return f"`{text}` - {job} asks for confirmation: confirm within {seconds:g} s or it is cancelled"


def confirm_expired(text: str, seconds: float) -> str:
    """No confirmation came in time."""
    return f"not confirmed within {seconds:g} s - `{text}` was cancelled, nothing was done"


def confirm_not_yours(owner: str) -> str:
    """Someone else clicked another person's confirmation."""
    return f"only {fmt.who(owner)}, who asked, can answer this confirmation"


def confirm_cancelled(text: str, user: str) -> str:
    """The requester declined their own confirmation."""
    return f"`{text}` cancelled by {fmt.who(user)} - nothing was done"


def denied(user: str, verb: str, job: str | None, role: str) -> str:
    """A request refused for lack of a role."""
    target = f" {job}" if job else ""
    return (
        f"{fmt.who(user)} may not `{verb}{target}` - it needs the {role} role "
        "(roles come from [auth] in the config, or [jobs.NAME.auth] for one job)"
    )


def queued(run_id: str, job: str) -> str:
    """The quick answer to restart/start/stop: the run is under way."""
    return f"queued run {run_id} for {job}"


def queued_detail(action: str, channel: str | None) -> str:
    """Where the run's steps will appear."""
    where = f" in <#{channel}>" if channel else ""
    return f"the {action} runs step by step{where}; the verified result follows in its thread"


def run_headline(run: RunRecord) -> str:
    """The headline of a run's live message: ``r-42: restart of dflash by <@U1> with topk patch, fresh cache``
    (a requeue by the scheduler: ``r-43: requeued: dflash (Slurm job 12, restart 1): …``, its post)."""
    if run.action == "requeue" and run.requeued:
        return f"{run.id}: {run.requeued}"
    extra = [f"with {patch_phrase(run.patches)}"] if run.patches else []
    extra += ["fresh cache"] if run.fresh_cache else []
    tail = (" " + ", ".join(extra)) if extra else ""
    by = acting(run.actor) if run.actor is not None else fmt.who(run.requested_by)
    return f"{run.id}: {run.action} of {run.job} by {by}{tail}"


def run_lock_lost(job: str) -> str:
    """The sequence lost its lock (expired or forced) while it ran."""
    return (
        f"warning: the lock on {job} was lost while this run held it (expired or forced by unlock) - "
        "another restart may have started; what follows is still this run's true outcome"
    )


def launch_summary(run_id: str, job: str, launched_as: str | None, window: float) -> str:
    """Posted in the run's thread when the launch step ended well.

    :param launched_as: the run's identity (:attr:`~pipeline.state.runs.RunRecord.launched_as`).
    :param window: seconds until the verdict (the job's ``start_window``).
    """
    proc = f" as {launched_as}" if launched_as is not None else ""
    return f"{run_id}: {job} launched{proc} - the verdict follows in about {window:g} s"


def stop_summary(run_id: str, job: str) -> str:
    """Posted in the run's thread when a stop finished."""
    return f"{run_id}: {job} stopped"


def cancel_requested(run_id: str, job: str) -> str:
    """``cancel JOB``: the run stops at its next step boundary."""
    return f"cancel requested for run {run_id} of {job} - it stops at the next step boundary"


def cancel_nothing(job: str) -> str:
    """``cancel JOB`` with nothing in flight."""
    return f"no restart of {job} in flight - nothing to cancel"


# --- grammar


def patch_phrase(patches: Sequence[str]) -> str:
    """``topk patch`` / ``topk and fast patches`` / ``a, b and c patches``."""
    names = list(patches)
    if len(names) == 1:
        return f"{names[0]} patch"
    return f"{', '.join(names[:-1])} and {names[-1]} patches"


def parse_too_long(limit: int) -> str:
    """A request longer than any command."""
    return f"that is too long for a command (at most {limit} characters) - type `help`"


# --- the two-person rule


def hashes_text(request: ApprovalRequest) -> str:
    """``topk sha256 1a2b3c4d5e6f`` for each patch, for the audit trail and ``history``."""
    return ", ".join(f"{p.name} sha256 {p.sha256[:HASH_SHOWN]}" for p in request.patches) or "no patch"


def approver_names(approvers: Sequence[str]) -> str:
    """``admins, <@U012AB>, <!subteam^S0ONCALL>``: who may approve, as the message shows them."""
    return ", ".join(f"{a}s" if a in APPROVER_ROLES else mention(a) for a in approvers)


def approval_waiting_title(request: ApprovalRequest) -> str:
    """The run's message while its request waits: who asked (``<@A> as <@B>`` for an admin's ``--as``)."""
    by = acting(request.actor) if request.actor is not None else fmt.who(request.requester)
    return f"{request.id}: `{request.text}` by {by} is waiting for approval"


def approval_asked(request_id: str, text: str) -> str:
    """The requester's answer."""
    return f"{request_id}: `{text}` waits for a second person's approval - nothing was done yet"


def approval_patch(name: str, sha256: str, size: int) -> str:
    """One patch under review: its name, hash and size (the whole diff is attached)."""
    return f"patch {name}: sha256 {sha256[:HASH_SHOWN]}… ({fmt.size(size)}; whole diff attached)"


def approval_who(approvers: Sequence[str]) -> str:
    """Who may click Approve/Deny."""
    return f"may approve: {approver_names(approvers)} (not the requester)"


def approval_expires(when: str) -> str:
    """When the request closes by itself."""
    return f"closes unapproved at {when}"


def approval_approved(request_id: str, by: str) -> str:
    """The request was approved; the run follows in this message."""
    return f"{request_id}: approved by {fmt.who(by)} - running"


def approval_denied(request_id: str, by: str, reason: str) -> str:
    """The request was denied."""
    why = f": {reason}" if reason else ""
    return f"{request_id}: denied by {fmt.who(by)}{why} - nothing was done"


def approval_expired(request_id: str, seconds: float) -> str:
    """Nobody decided in time."""
    return f"{request_id}: expired after {fmt.duration(seconds)} without a decision - nothing was done"


def approval_self(request_id: str) -> str:
    """The requester clicked Approve on their own request."""
    return f"you asked for {request_id}, so you cannot approve it - a second person must"


def approval_not_approver(user: str, request_id: str, approvers: Sequence[str]) -> str:
    """Someone without the right clicked Approve or Deny."""
    return f"{fmt.who(user)} may not decide {request_id} - approvers: {approver_names(approvers)}"


def approval_already(request_id: str, state: str, by: str) -> str:
    """A decision came after another one (the first decision wins)."""
    whom = f" by {fmt.who(by)}" if by else ""
    return f"{request_id} was already {state}{whom} - nothing was done"


def approval_not_request(request_id: str) -> str:
    """``approve r-N`` for a run that was never a request."""
    return f"{request_id} is not a request waiting for approval (see `pending`)"


def approval_unreadable(name: str, path: str, error: str) -> str:
    """A patch under review cannot be read: nothing can be shown, so nothing is asked."""
    return f"cannot read patch {name} ({path}): {error} - nothing was asked or done"


def approval_denied_ack(request_id: str) -> str:
    """The denier's answer."""
    return f"{request_id} denied - the requester sees it in the run's message"


def approval_record(request: ApprovalRequest) -> str:
    """The audit detail of a decision: requester, decision, hashes (``history`` shows it)."""
    base = f"{request.id} {request.state.value}: `{request.text}` asked by {request.requester}"
    by = f", {request.state.value} by {request.decided_by}" if request.decided_by else ""
    why = f" ({request.reason})" if request.reason else ""
    return f"{base}{by}{why}; {hashes_text(request)}"


def break_glass_announce(actor: Actor, text: str, reason: str) -> str:
    """An admin acted without approval: said in the channel."""
    return f"break glass: {acting(actor)} ran `{text}` without approval - reason: {reason}"


# --- who acted, as the surface proved it


def acting(actor: Actor) -> str:
    """``<@U0MAYA>``, or ``<@U0ADMIN> as <@U0OPS>`` when an admin acted for someone (``--as``)."""
    return f"{fmt.who(actor.by)} as {fmt.who(actor.user)}" if actor.by else fmt.who(actor.user)


def actor_text(actor: Actor | None, user: str) -> str:
    """Who acted and through which door, as ``history`` shows it: ``<@U0MAYA> (cli: maya)``,
    ``<@U0ADMIN> as <@U0OPS> (console: root)``, ``<@U0LEE> (slack)``; ``user`` alone for a record
    older than these (``actor`` None or without a surface)."""
    if actor is None:
        return fmt.who(user)
    return f"{acting(actor)} ({actor.door})" if actor.door else acting(actor)


#: the verbs that must be done as oneself, proven: ``--as`` is refused for them
OWN_ACTS = ("approve", "deny", "--break-glass")


def unproven_actor(verb: str, os_user: str) -> str:
    """``approve``/``deny``/``--break-glass`` from a CLI or console that nothing proves the identity of."""
    return (
        f"{verb} is refused from the CLI and console until they know who you are: map OS users to Slack "
        f'ids in [auth.cli] (e.g. `{os_user or "maya"} = "U0123ABCD"`), or {verb} in Slack'
    )


def impersonated(verb: str, by: str, user: str) -> str:
    """``--as`` for a verb done only as oneself."""
    return (
        f"{verb} acts as yourself ({fmt.who(by)}), never --as {user}: run it without --as "
        f"({', '.join(OWN_ACTS)} are refused --as)"
    )


def approval_refused(request_id: str, reason: str) -> str:
    """An approved request closed unrun: its requester no longer holds the role it needs."""
    return f"{request_id}: closed without running - {reason}"


def requester_lost_role(requester: str, denied: str) -> str:
    """Why an approved request was not run: the requester, authorised again with fresh groups, was refused."""
    return f"its requester {fmt.who(requester)} may no longer do it ({denied})"


def break_glass_note(reason: str) -> str:
    """After the queued run's headline (and so in its audit record): it runs without approval."""
    return f" - break glass, without approval: {reason}"


def pending_title(n: int) -> str:
    """``pending``'s headline."""
    return f"{n} request{'s' if n != 1 else ''} waiting for approval"


def pending_none(job: str | None) -> str:
    """``pending`` with nothing waiting."""
    return f"nothing waiting for approval{f' for {job}' if job else ''}"


def pending_line(request_id: str, text: str, requester: str, hashes: str, left: str) -> str:
    """One waiting request."""
    return f"{request_id}: `{text}` by {fmt.who(requester)} · {hashes} · closes in {left}"


# --- alerts


def alert_detected_cause(cause: str) -> str:
    """The cause found in the log."""
    return f"detected cause: {cause}"


def alert_exit_cause(code: int | None, signal: str | None) -> str:
    """How the job's launched process ended, from its waiter's record."""
    if signal:
        hint = " (the kernel's OOM killer, or someone's kill -9)" if signal == "SIGKILL" else ""
        return f"killed by {signal}{hint}"
    if code is None:
        return "ended (status unknown)"
    return f"exited with code {code}"


def incident_resolved(i: Incident, open_for: float, gpus: int | None = None) -> str:
    """The thread reply when an incident resolves, ``open_for`` seconds after it opened; with the
    job's GPU count, what it cost (``- cost 0.6 GPU-h``, :func:`~pipeline.digest.goodput.incident_cost`)."""
    cost = incident_cost(i.kind.value, open_for, gpus)
    return _resolved_how(i, open_for) + (f" - {cost}" if cost else "")


def _resolved_how(i: Incident, open_for: float) -> str:
    after = f"resolved after {fmt.duration(open_for)}"
    resolution = i.resolution or "running"
    if resolution == "stopped":
        return f"{after}: {i.job} was stopped on purpose"
    if resolution == "reachable":
        return f"{after}: the host of {i.job} is reachable again"
    if i.kind is IncidentKind.IDLE_GPUS:
        return f"{after}: the GPUs of {i.job} are working again"
    if i.kind in (IncidentKind.LOSS_NAN, IncidentKind.LOSS_SPIKE):
        return f"{after}: the loss of {i.job} is healthy again"
    return f"{after}: {i.job} is running again ({i.count}/{i.expected} processes)"


def loss_rollback(job: str, rollback_step: int | None, since: int | None) -> str:
    """A loss alert's way back: the newest checkpoint before its trouble began (step ``since``)."""
    if rollback_step is None:
        return f"no checkpoint of {job} from before step {since} was found to roll back to"
    return f"`restart {job} from step {rollback_step}` rolls back to checkpoint step {rollback_step}, the newest before step {since}"


def loss_stopping(job: str, loss: str | None, answer: str) -> str:
    """The thread note when a NaN loss stops the job (``on_loss_nan = "stop"``), with the dispatcher's answer."""
    return f'stopping {job}: its loss is {loss or "NaN"} (on_loss_nan = "stop"): {answer}'


def incident_reminder(job: str, kind: str, open_for: float) -> str:
    """The thread re-post of an incident still open and not acknowledged."""
    return (
        f"still {kind.replace('_', ' ')}: {job}, for {fmt.duration(open_for)} - `ack {job}` to stop reminders"
    )


def crash_loop_gave_up(incident: Incident, policy: AutoRestart | None) -> str:
    """The single give-up alert of a crash loop (``policy``: the job's ``auto_restart``)."""
    within = fmt.duration(policy.within if policy else 0.0)
    return (
        f"{incident.job} crashed again after {incident.auto_restarts} automatic restarts within {within} - "
        "crash loop, giving up; restart it by hand once the cause is fixed"
    )


#: what the default ``exit_codes`` mean, as the tool that exits with them defines it
EXIT_CODE_MEANINGS = {
    93: "nvidia-resiliency-ext gave up: no progress",
    17: "Megatron-LM's rerun state machine: a validation failed",
    16: "Megatron-LM's rerun state machine: rerun on other hardware",
}


def exit_code_refusal(job: str, code: int, summary: str) -> str:
    """Why a job whose own exit code is ``no_restart`` in ``exit_codes`` is not restarted automatically."""
    meaning = f" ({EXIT_CODE_MEANINGS[code]})" if code in EXIT_CODE_MEANINGS else ""
    return (
        f"{job} exited with code {code}{meaning}, which exit_codes maps to no_restart - no automatic "
        f"restarts; restart it by hand once the cause is fixed. Cause: {summary}"
    )


_SCHEDULED_END = {"preempted": "its preemption", "time_limit": "reaching its time limit"}


def scheduled_restart(job: str, kind: str, used: int, limit: int, answer: str) -> str:
    """The thread note of an automatic restart after a preemption or a time limit: not counted."""
    return (
        f"automatic restart of {job} after {_SCHEDULED_END.get(kind, kind)} (not a crash: not counted, "
        f"{used}/{limit} attempts used): {answer}"
    )


def timeout_resubmit(job: str, answer: str) -> str:
    """The thread note of ``resubmit_on_timeout``'s resubmission: not an ``auto_restart`` attempt."""
    return f"resubmitted {job} after reaching its time limit (resubmit_on_timeout; not a crash: not counted): {answer}"


def probe_slow_line(host: str, seconds: float) -> str:
    """Log line: a host's probe took longer than its jobs' watch interval."""
    took = fmt.duration(seconds) if seconds >= 10 else f"{seconds:.1f} s"
    return f"probe slow: {host} took {took}"


# --- escalation: an unacknowledged incident told to more people, step by step

#: how a ``notify`` entry of an escalation step is named where it is not a mention
NOTIFY_WORDS = MappingProxyType({"owners": "the owners", "channel": "the channel", "pager": "the pager"})


def notified(entries: Sequence[str]) -> str:
    """The people an escalation step tells, as words and mentions: ``<!subteam^S0LEADS>, the pager``."""
    return ", ".join(NOTIFY_WORDS.get(e) or mention(e) for e in entries)


def escalation_next(entries: Sequence[str], at: float, now: float, timezone: str) -> str:
    """When the next escalation step of an open incident is due, and whom it tells."""
    when = "now" if at <= now else f"at {fmt.clock(at, timezone, now=now)} (in {fmt.duration(at - now)})"
    return f"escalates to {notified(entries)} {when} unless acknowledged"


def escalated(job: str, step: int, steps: int, open_for: float, told: str) -> str:
    """The thread note of an escalation step taken (``step`` counted from 1)."""
    return (
        f"escalated ({step}/{steps}): {job} not acknowledged after {fmt.duration(open_for)} - "
        f"telling {told}; `ack {job}` stops it"
    )


ONCALL_HEADERS = ("job", "incident", "host", "open for", "acknowledged", "next escalation")
ONCALL_NONE = "nothing open: no incident on any job"


def oncall_title(open_: int, unacked: int) -> str:
    """The ``oncall`` answer's headline."""
    return f"on call: {open_} open incident{'' if open_ == 1 else 's'}, {unacked} not acknowledged"


def maintenance_announced(job: str, length: str, until: str, who: str, reason: str | None) -> str:
    """``maintenance JOB DURATION "REASON"``: the window, announced in the job's channel."""
    why = f": {reason}" if reason else ""
    return f"maintenance of {job} for {length} (until {until}), by {who}{why} - no alerts, no escalation"


def maintenance_ends(job: str) -> str:
    """How a maintenance window ends early."""
    return f"it ends by itself; `watch {job} on` ends it now"


def pager_acker(name: str) -> str:
    """Who acknowledged an incident in PagerDuty, as its ``acked_by`` shows them."""
    return f"{name} (in PagerDuty)"


def not_paged(hours: str) -> str:
    """An escalation step's pager, outside the policy's ``hours``."""
    return f"not the pager (it pages {hours} only)"


def escalation_stopped(job: str) -> str:
    """``watch JOB off`` with an incident open: its escalation ends there."""
    return f"escalation of the {job} incident stopped (watching paused)"


# --- read-only verbs: status, lock, unlock, logs, history, help


def checkpoints_title(job: str, directory: str, count: int, intact: Sequence[int]) -> str:
    """``checkpoints JOB``'s headline: ``checkpoints of dflash in /srv/ckpt: 3, newest intact step 530``."""
    newest = f"newest intact step {intact[0]}" if intact else "none intact"
    return f"checkpoints of {job} in {directory}: {count}, {newest}"


def checkpoint_state(verified: str | None, damage: str | None) -> str:
    """A checkpoint's state cell: ``verified (size)``, ``verified (sha256)``, ``damaged: drafter.pt is …``."""
    return f"damaged: {damage}" if damage is not None else f"verified ({verified or 'size'})"


def checkpoints_none_configured(job: str) -> str:
    """``checkpoints JOB`` of a job without ``checkpoint_dir``."""
    return f"{job} has no checkpoint_dir: set [jobs.{job}] checkpoint_dir to list its checkpoints"


def checkpoints_none(job: str, directory: str) -> str:
    """``checkpoints JOB`` when the directory holds no ``step-NNNNNN`` checkpoint."""
    return f"no step-NNNNNN checkpoint of {job} in {directory}"


def checkpoints_unreadable(job: str, error: str) -> str:
    """``checkpoints JOB`` when the host cannot be asked."""
    return f"cannot list the checkpoints of {job}: {error}"


def lock_free(job: str) -> str:
    """``lock JOB`` when nothing holds it."""
    return f"no restart of {job} in flight - the lock is free"


def lock_held(scope: str, action: str, job: str, user: str, seconds: float, step: str, run_id: str) -> str:
    """``lock JOB`` when something holds it."""
    run = f" (run {run_id})" if run_id else ""
    return (
        f"{scope} is locked: {action} of {job}{run} started by {fmt.who(user)} {int(seconds)} s ago, "
        f"now at: {step}"
    )


def unlocked(scope: str, user: str, holder: str | None) -> str:
    """``unlock JOB`` forced the lock free."""
    was = f" (was held by {fmt.who(holder)})" if holder else ""
    return f"lock on {scope} released by {fmt.who(user)}{was}"


def unlock_not_held(scope: str) -> str:
    """``unlock JOB`` when nothing held the lock."""
    return f"{scope} was not locked - nothing to release"


def logs_title(lines: int, path: str, job: str) -> str:
    """What a ``logs`` excerpt is."""
    return f"last {lines} lines of {path} ({job})"


def history_title(job: str | None, count: int) -> str:
    """The heading of ``history``."""
    of = f" of {job}" if job else ""
    return f"history{of}: last {count} run{'s' if count != 1 else ''}"


def lock_forced_note(user: str) -> str:
    """Posted in a run's thread when ``unlock`` freed its lock."""
    return f"the lock of this run was forced free by {fmt.who(user)}"


# --- reports: digests and GPUs


def digest_progress(p: TrainingProgress) -> str:
    """``drafter step 12,000 of 100,000 (12.0 %), ETA 3 h 5 min at 7.93 steps/s`` (the current rate)."""
    role = f"{p.role} " if p.role else ""
    done = f"{role}step {p.step:,} of {p.total:,} ({p.fraction * 100:.1f} %)"
    if p.step >= p.total:
        return f"{done}, done"
    if p.eta_s is None:
        return f"{done}, ETA unknown (no rate in this window)"
    return f"{done}, ETA {fmt.duration(p.eta_s)} at {p.steps_per_s:.2f} steps/s"


def digest_targets(tokens_per_s: float | None, ranks: int) -> str:
    """The target ranks' own throughput, shown apart: the drafters consume what the targets produce."""
    return (
        f"{fmt.number(tokens_per_s)} tokens/s over {ranks} rank(s), not added to the pipeline's throughput"
        " (the drafters consume what the targets produce)"
    )


def digest_silent_cell(last_seen: float | None) -> str:
    """A silent rank's cell in the digest's rank table: ``silent since 02:06:13 UTC``."""
    if last_seen is None:
        return "silent (no metric line seen yet)"
    return f"silent since {fmt.clock(last_seen, date=False)}"


def digest_window_note(kind: str, path: str, max_bytes: int) -> str | None:
    """Why a window is not simply 'since the last digest' (``None`` when it is)."""
    notes = {
        "last_bytes": f"first digest of {path}: read its last {fmt.size(max_bytes)} at most",
        "repeat": "nothing new since the last scheduled digest - showing its window again",
        "truncated": f"{path} was truncated since the last digest - read from its start",
        "rotated": f"{path} was replaced (rotated) since the last digest - read the new file from its start",
    }
    return notes.get(kind)


def digest_starved(queue_mean: float) -> str:
    """The drafters' hidden-state queue is ~empty: the targets cannot keep up."""
    return (
        f"drafters are starved: mean hidden-state queue depth {queue_mean:.2f} - "
        "the target GPUs cannot keep up"
    )


def digest_resets(count: int) -> str:
    """Token counters went down inside the window (a relaunch)."""
    return f"{count} token counter reset(s) in the window (a relaunch); counted from zero after each"


def digest_empty(job: str, read: int, path: str, why: str | None) -> str:
    """No metric line in the window: ``no metric lines for tj in the 1.1 KiB read from /srv/m.log
    (40 JSON lines, none with step)`` — ``why`` from :func:`pipeline.observe.metrics.why_none`."""
    because = f" ({why})" if why else ""
    return f"no metric lines for {job} in the {fmt.size(read)} read from {path}{because}"


def digest_reported(timed: bool) -> str:
    """Rates taken from the lines' own per-second fields rather than measured between them
    (``timed``: the lines have ``ts``, so only samples/s is)."""
    if not timed:
        return (
            "the metric lines have no ts: rates are their own tokens_per_s / samples_per_s, "
            "averaged (add ts to measure them)"
        )
    return "samples/s is the metric lines' own samples_per_s, averaged"


def digest_all_title(jobs: int) -> str:
    """Heading of ``digest`` without a job: one follow-up per job."""
    return f"digest of {jobs} job(s)"


def unknown_name(kind: str, name: str, suggestions: Sequence[str]) -> str:
    """``digest NAME`` or ``gpus NAME`` for a ``kind`` (``job``, ``host``) that is not configured."""
    hint = f" - did you mean {' or '.join(suggestions)}?" if suggestions else ""
    return f"no {kind} named {name}{hint}"


def gpus_unavailable(host: str, detail: str) -> str:
    """``gpus HOST`` when the host gave no GPU data."""
    return f"no GPU data from {host}: {detail}"


def gpus_title(host: str, count: int) -> str:
    """Heading of ``gpus HOST``."""
    return f"GPUs on {host}: {count}"


# --- Slurm nodes: nodes, drain, undrain --------------------------------------------------------------

#: the columns of ``nodes``: Slurm's state (``scontrol``) and short state (``sinfo``), its reason,
#: the jobs on the node (Pitstop's by name), what Pitstop holds against it
NODES_HEADERS = ("node", "state", "sinfo", "reason", "jobs", "pitstop")
#: ``nodes`` when no job Pitstop knows runs on Slurm
NODES_NO_SLURM = "no Slurm job is configured: `nodes` lists the nodes of the clusters Slurm jobs run on"


def nodes_title(cluster: str, jobs: Sequence[str], count: int) -> str:
    """``nodes of the cluster of trainer, eagle (login): 3``."""
    return f"nodes of the cluster of {', '.join(jobs)} ({cluster}): {count}"


def nodes_unavailable(cluster: str, detail: str) -> str:
    """A cluster whose nodes could not be listed."""
    return f"the nodes of {cluster} could not be listed: {detail}"


def nodes_not_slurm(job: str) -> str:
    """``nodes JOB`` for a job that is not a Slurm job."""
    return f"{job} is not a Slurm job: `nodes` lists a Slurm cluster's nodes (`nodes` alone lists every one)"


def nodes_no_cluster(host: str) -> str:
    """``nodes HOST`` for a host no Slurm job logs in to."""
    return f"no Slurm job runs through {host}: `nodes` alone lists every cluster Pitstop knows"


def node_held(by: str, reason: str, at: float) -> str:
    """What Pitstop holds against a node it drained: ``drained by <@U1> at 12:03 UTC: bad ECC``."""
    return f"drained by {fmt.who(by)} at {fmt.clock(at)}: {reason}"


def node_suspect(why: str, at: float, until: float) -> str:
    """A suspect node in the ``nodes`` table: ``suspect until 10:14 UTC: Xid 79 (seen 10:14 UTC)``."""
    return f"suspect until {fmt.clock(until, date=True)}: {why} (seen {fmt.clock(at, date=False)})"


def node_failed(state: str | None, reason: str | None) -> str:
    """Why a node Slurm saw fail is suspect: ``NODE_FAIL (DOWN*, Not responding)``."""
    said = ", ".join(b for b in (state, reason) if b)
    return f"NODE_FAIL ({said})" if said else "NODE_FAIL"


def suspect_stuck(rank: int, step: int | None) -> str:
    """Why a stuck rank's node is suspect: ``rank 5 stuck at step 120``."""
    return f"rank {rank} stuck" + (f" at step {step}" if step is not None else "")


def suspect_degraded(cause: str) -> str:
    """Why a node short of processes is suspect: ``degraded: n2 has 0/4 processes (Slurm job 12)``."""
    return f"degraded: {cause}"


def suspects_told(clues: Mapping[str, str], until: float) -> str:
    """The alert's line on the nodes its evidence made suspect: ``suspect until 10:14 UTC (automatic
    restarts leave them out): n2 (Xid 79)``."""
    named = ", ".join(f"{n} ({why})" for n, why in sorted(clues.items()))
    return f"suspect until {fmt.clock(until, date=True)} (automatic restarts leave them out): {named}"


def suspect_warning(job: str, suspects: Mapping[str, tuple[str, float]], exclude: Sequence[str]) -> str:
    """A person's restart of a job whose cluster has suspect nodes it does not leave out:
    ``n2 is suspect (Xid 79 at 10:14): restart dflash excluding n2``."""
    said = "; ".join(
        f"{n} is suspect ({why} at {fmt.clock(at, date=False)})" for n, (why, at) in suspects.items()
    )
    return f"{said}: restart {job} excluding {','.join(exclude)}"


def node_unknown(node: str, where: str, suggestions: Sequence[str], known: Sequence[str]) -> str:
    """A node verb for a node the cluster(s) do not have, with did-you-mean."""
    hint = f" - did you mean {' or '.join(repr(s) for s in suggestions)}?" if suggestions else ""
    return f"unknown node {node!r} on {where}{hint} (known: {', '.join(known) or 'none'})"


def node_ambiguous(node: str, verb: str, jobs: Sequence[str]) -> str:
    """A node name several clusters have: the verb must say which."""
    return (
        f"{node} is a node of several Slurm clusters (those of {', '.join(jobs)}): "
        f"say `{verb} {node} … on JOB` with JOB one of them"
    )


def node_done(verb: str, node: str, job: str, state: str, reason: str) -> str:
    """After ``drain``/``undrain``: ``drained n2 on the cluster of trainer: now MIXED+DRAIN (bad ECC)``."""
    why = f" ({reason})" if reason else ""
    return f"{verb}ed {node} on the cluster of {job}: now {state}{why}"


def node_announce(user: str, verb: str, node: str, job: str, reason: str | None) -> str:
    """Said in the channel of the jobs on the node: ``<@U1> drained n2 (cluster of trainer): bad ECC``."""
    why = f": {reason}" if reason else ""
    return f"{fmt.who(user)} {verb}ed Slurm node {node} (cluster of {job}){why}"


def node_refused(verb: str, node: str, detail: str) -> str:
    """Slurm refused a drain or undrain."""
    return f"could not {verb} {node}: {detail}"
