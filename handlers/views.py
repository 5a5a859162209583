"""The read-only verbs: status, logs, patches, lock, history, help — and ``unlock``.

Each takes the :class:`~handlers.context.Context` and a validated
:class:`~handlers.commands.Command` and returns a :class:`~handlers.reply.Reply`.  They may
do their remote work inline (the Slack surface acks first): ``status`` probes each host once
(:func:`pipeline.hostprobe.probe_host`), ``logs`` and ``patches`` ask the Restarter.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

from handlers import grammar
from handlers.audit import REFUSALS, Audit
from handlers.commands import Command
from handlers.context import Context
from handlers.lock import Holder, force_release, read_holder
from handlers.reply import Reply, Status, Table
from handlers.runview import thread_key
from handlers.slurmviews import slurm_probes, status_bits
from pipeline import keys, messages
from pipeline.config import Config
from pipeline.errors import RemoteError
from pipeline.hostprobe import JobProbe, probe_host
from pipeline.jobstate import scope_of
from pipeline.runs import Outcome, RunRecord, Step

_MAX_REFUSALS = 10


def _tz(config: Config) -> ZoneInfo:
    try:
        return ZoneInfo(config.scheduler.timezone)
    except (KeyError, ValueError):
        return ZoneInfo("UTC")


def _when(config: Config, ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).astimezone(_tz(config)).strftime("%Y-%m-%d %H:%M")


def _run_outcome(run: RunRecord) -> str:
    if run.verdict is not None:
        return run.verdict.value
    if run.finished_at is not None:
        return messages.run_done()
    verify = run.step(Step.VERIFY)
    if verify is not None and verify.outcome in (Outcome.WAITING, Outcome.RUNNING):
        return messages.awaiting_verdict()
    step = run.current_step
    return messages.in_progress(step.value if step else None)


# --- status ---------------------------------------------------------------------------------------


async def status_command(ctx: Context, job: str | None) -> Reply:
    """``status [JOB]``: per job its state (running/stopped/unknown), PID, processes n/expected,
    uptime, last restart and who, lock holder, patches in effect.

    Probes each host once for all its jobs; a host that cannot be reached makes its jobs'
    state ``unknown`` (with the reason) rather than failing the whole answer.
    """
    config = ctx.config
    names = [job] if job else list(config.jobs)
    if not names:
        return Reply(title=messages.status_none(), status=Status.WARNING)
    client, prefix = ctx.redis.client, ctx.prefix
    snaps = {s.name: s for s in await ctx.jobs.read_many(names)}
    currents = {name: dict(s.current) for name, s in snaps.items()}
    by_host: dict[str, list[str]] = {}
    on_slurm = [n for n in names if config.jobs[n].engine == "slurm"]
    for name in names:
        if name not in on_slurm:
            by_host.setdefault(config.jobs[name].host, []).append(name)
    probes: dict[str, JobProbe] = {}
    results = await asyncio.gather(
        *(
            probe_host(ctx.ssh, host, [(n, config.jobs[n], currents[n] or None) for n in members])
            for host, members in by_host.items()
        )
    )
    for part in results:
        probes.update(part)
    slurm_jobs = await slurm_probes(ctx, on_slurm, currents) if on_slurm else {}
    rows: list[tuple[str, ...]] = []
    lines: list[str] = []
    tone = Status.OK
    now = time.time()
    for name in names:
        spec = config.jobs[name]
        probe = (
            slurm_jobs[name][0]
            if name in slurm_jobs
            else probes.get(name, JobProbe(job=name, error="no answer"))
        )
        snap = snaps[name]
        bits = status_bits(ctx, name, *slurm_jobs[name]) if name in slurm_jobs else None
        if bits is not None:
            state, procs = bits.state, bits.procs
            if bits.line:
                lines.append(bits.line)
            if not bits.healthy and tone is Status.OK:
                tone = Status.WARNING if probe.error is None and bits.state != "unknown" else Status.ERROR
        elif probe.error is not None:
            state, procs = "unknown", "?"
            lines.append(messages.status_probe_failed(name, spec.host, probe.error))
            tone = Status.ERROR
        else:
            state = "running" if probe.count > 0 else "stopped"
            procs = f"{probe.count}/{spec.processes}"
            if probe.count != spec.processes and tone is Status.OK:
                tone = Status.WARNING
        pid = snap.pid
        uptime = ""
        if bits is not None:
            pid, uptime = ("" if bits.pid == "-" else bits.pid), ("" if bits.uptime == "-" else bits.uptime)
        elif state == "running" and snap.launched_at is not None:
            uptime = messages.span(now - snap.launched_at)
        latest = snap.latest
        last = (
            messages.status_last_run(
                latest.id,
                latest.action,
                messages.ago(now - latest.created_at),
                latest.requested_by,
                _run_outcome(latest),
            )
            if latest
            else ""
        )
        holder = (
            Holder.from_hash(snap.scope, snap.lock_holder) if snap.lock_held and snap.lock_holder else None
        )
        lock = messages.status_lock(holder.action, holder.user, holder.step) if holder else ""
        rows.append(
            (
                name,
                state,
                pid or "-",
                procs,
                uptime or "-",
                last or "-",
                lock or "-",
                ", ".join(snap.patches) or "-",
            )
        )
    failure = await client.hgetall(keys.delivery_failure(prefix))  # written by the Slack outbox
    if failure.get("line"):
        try:
            ago = messages.ago(now - float(failure.get("at", now)))
        except ValueError:
            ago = "?"
        lines.append(messages.status_delivery_failure(str(failure["line"]), ago))
    return Reply(
        title=messages.status_title(len(names)),
        status=tone,
        tables=(Table(messages.status_headers(), tuple(rows)),),
        lines=tuple(lines),
    )


# --- logs, patches ----------------------------------------------------------------------------------


async def logs_command(ctx: Context, job: str, lines: int) -> Reply:
    """``logs JOB [N]``: the last N lines of the job's log.

    :raises RemoteError: if the log cannot be read.
    """
    spec = ctx.config.jobs[job]
    text = await ctx.restarter.log_tail(job, lines)
    title = messages.logs_title(lines, spec.log, job)
    if not text.strip():
        return Reply(title=title, lines=(messages.logs_empty(job),))
    return Reply(title=title, log=text)


async def patches_command(ctx: Context, job: str) -> Reply:
    """``patches JOB``: the configured patches and those in effect in the workdir now.

    Asks the host (``git apply --reverse --check``); if it cannot be reached, shows the set
    the last restart recorded, saying so.
    """
    spec = ctx.config.jobs[job]
    lines: list[str] = []
    tone = Status.INFO
    try:
        in_effect = list(await ctx.restarter.patches_in_effect(job))
    except RemoteError as exc:
        members = await ctx.redis.client.smembers(keys.job_patches(ctx.prefix, job))
        in_effect = sorted(str(m) for m in members)
        lines.append(messages.patches_recorded_only(exc.message))
        tone = Status.WARNING
    return Reply(
        title=messages.patches_title(job),
        status=tone,
        fields=(
            (messages.field_available(), messages.patches_available(list(spec.patches))),
            (messages.field_in_effect(), messages.patches_in_effect(in_effect)),
        ),
        lines=tuple(lines),
    )


# --- lock, unlock -----------------------------------------------------------------------------------


def _holder_reply(config: Config, holder: Holder) -> Reply:
    fields = [(messages.field_since(), _when(config, holder.started_at))]
    if holder.run_id:
        fields.append((messages.field_run(), holder.run_id))
    return Reply(
        title=messages.lock_held(
            holder.scope, holder.action, holder.job, holder.user, holder.age(), holder.step, holder.run_id
        ),
        status=Status.WARNING,
        fields=tuple(fields),
        run_id=holder.run_id or None,
    )


async def lock_command(ctx: Context, job: str) -> Reply:
    """``lock JOB``: who holds the job's restart lock, since when, which step."""
    holder = await read_holder(ctx.redis.client, ctx.prefix, scope_of(ctx.config, job))
    if holder is None:
        return Reply(title=messages.lock_free(job), status=Status.OK)
    return _holder_reply(ctx.config, holder)


async def unlock_command(ctx: Context, job: str, user: str) -> tuple[Reply, Holder | None]:
    """``unlock JOB`` (admin): force the lock free; the holder's run learns it lost the lock.

    :returns: the reply and who held the lock (None if it was free).
    """
    scope = scope_of(ctx.config, job)
    holder = await force_release(ctx.redis.client, ctx.prefix, scope)
    if holder is None:
        return Reply(title=messages.unlock_not_held(scope), status=Status.INFO), None
    if holder.run_id:
        channel = ctx.config.channel_for(holder.job) if holder.job in ctx.config.jobs else None
        note = Reply(
            title=messages.lock_forced_note(user), status=Status.WARNING, thread_key=thread_key(holder.run_id)
        )
        await ctx.outbox.thread(thread_key(holder.run_id), note, channel)
    return Reply(title=messages.unlocked(scope, user, holder.user), status=Status.WARNING), holder


# --- history ------------------------------------------------------------------------------------------


async def history_command(ctx: Context, audit: Audit, job: str | None, count: int) -> Reply:
    """``history [JOB] [N]``: the last N runs (run id, when, who, action, patches, verdict,
    duration), newest first, and the recent denied/refused/failed requests from the audit trail."""
    config = ctx.config
    runs = await ctx.runs.recent(job, count)
    rows = []
    for run in runs:
        end = run.finished_at or run.launched_at
        took = messages.span(end - run.created_at) if end else "-"
        rows.append(
            (
                run.id,
                _when(config, run.created_at),
                messages.who(run.requested_by),
                run.action,
                ", ".join(run.patches) or "-",
                run.verdict_line or _run_outcome(run),
                took,
            )
        )
    refusals = await audit.recent(job=job, outcomes=REFUSALS, count=min(count, _MAX_REFUSALS))
    tables = []
    lines: list[str] = []
    follow_ups: list[Reply] = []
    if rows:
        tables.append(Table(messages.history_headers(), tuple(rows)))
    else:
        lines.append(messages.history_none(job))
    if refusals:
        refused = Table(
            messages.history_refusal_headers(),
            tuple(
                (
                    _when(config, e.ts),
                    messages.who(e.user),
                    e.text[:80],
                    e.outcome.value,
                    e.detail.splitlines()[0][:120] if e.detail else "",
                )
                for e in refusals
            ),
        )
        follow_ups.append(Reply(title=messages.history_refusals_title(), tables=(refused,)))
    return Reply(
        title=messages.history_title(job, len(runs)),
        tables=tuple(tables),
        lines=tuple(lines),
        follow_ups=tuple(follow_ups),
    )


# --- help ------------------------------------------------------------------------------------------------


def help_command(config: Config, command: Command) -> Reply:
    """``help [VERB]``: every verb's usage, what it does and the role it needs; or one verb's
    usage lines and examples.  Derived from the command table (:data:`handlers.grammar.GRAMMAR`)."""
    topic = command.topic
    if topic is not None:
        spec = grammar.VERBS[topic]
        lines = [f"`{u}`" for u in spec.usages[1:]]
        lines += [spec.summary, messages.help_role(spec.role.label)]
        if spec.examples:
            lines.append(messages.help_examples(spec.examples))
        return Reply(title=messages.help_verb_title(spec.usages[0]), lines=tuple(lines))
    lines = [messages.help_line(spec.usages[0], spec.summary, spec.role.label) for spec in grammar.GRAMMAR]
    lines.append(messages.help_footer(config.slack.command))
    return Reply(title=messages.help_title(), lines=tuple(lines))
