"""The read-only verbs: status, logs, patches, lock, history (``--attempts``: one row per attempt), help,
``follow r-N`` — and ``unlock``.

They do their remote work inline (the Slack surface acks first) and return a :class:`~handlers.reply.Reply`.

``follow r-N`` answers with the run's message as it is (:func:`follow_command`); the surface then
shows what :func:`follow_run` yields, read from the run's own event stream
(:meth:`pipeline.state.events.Events.read_run`): ``pitstop say`` and the console print each step
change and the verdict, Slack keeps the run's message up to date.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator, Sequence

from handlers import text as words
from handlers.context import Context
from handlers.grammar import parse as grammar
from handlers.grammar.commands import Command, ParseError, parse
from handlers.reply import Reply, Status, StepLine, Table, refused
from handlers.runs.view import run_reply, step_lines, thread_key
from handlers.watch.alerts import job_owners, next_step_line
from pipeline import fmt
from pipeline.config import Config
from pipeline.digest.goodput import DAY_S, GOODPUT_RUNS, goodput_line, job_goodput
from pipeline.engines.base import Sighting
from pipeline.engines.workdir import patch_digest
from pipeline.errors import ExitCode, RemoteError
from pipeline.fmt import who
from pipeline.host.probe import JobProbe
from pipeline.observe.checkpoints import damage_text
from pipeline.observe.watch import probe_slow
from pipeline.state.audit import APPROVALS, REFUSALS, Audit, AuditEntry
from pipeline.state.deliveries import Posts, UndeliveredAlerts
from pipeline.state.events import BLOCK_S
from pipeline.state.jobstate import scope_of
from pipeline.state.locks import Holder
from pipeline.state.runs import RunRecord
from pipeline.verdict import Outcome, Step

_MAX_REFUSALS = 10
NA = fmt.UNKNOWN


def _when(config: Config, ts: float) -> str:
    """``21:15:01 UTC`` today, with the date in front on another day (the configured timezone)."""
    return fmt.clock(ts, config.scheduler.timezone)


def _run_outcome(run: RunRecord) -> str:
    if run.verdict is not None:
        return run.verdict.value
    if run.finished_at is not None:
        return words.RUN_DONE
    verify = run.step(Step.VERIFY)
    if verify is not None and verify.outcome in (Outcome.WAITING, Outcome.RUNNING):
        return words.RUN_AWAITING_VERDICT
    step = run.current_step
    return f"in flight ({step.value})" if step else "in flight"  # a run without verdict yet


async def status_command(ctx: Context, job: str | None) -> Reply:
    """``status [JOB]``: per job its state (running/stopped/unknown), PID, processes n/expected,
    uptime, last restart and who, lock holder, patches in effect.  Probes each host once; one that
    cannot be reached makes its jobs' state ``unknown`` (with the reason), not a failed answer."""
    config = ctx.config
    names = [job] if job else list(config.jobs)
    if not names:
        return Reply(title=words.STATUS_NONE, status=Status.WARNING)
    snaps = {s.name: s for s in await ctx.service.jobs.read_many(names)}
    seen = await ctx.restarter.sightings([(n, config.jobs[n], dict(snaps[n].current) or None) for n in names])
    now = time.time()  # after the probes: "ago" and uptimes as of the answer
    rows: list[tuple[str, ...]] = []
    lines: list[str] = []
    tone = Status.OK
    slow_hosts: set[str] = set()
    for name in names:
        spec, snap = config.jobs[name], snaps[name]
        sight = seen.get(name) or Sighting(JobProbe(job=name, error="no answer"), spec.processes)
        if probe_slow(snap.watch.probe_s, spec) and spec.host not in slow_hosts:
            slow_hosts.add(spec.host)
            slow = words.probe_slow_line(spec.host, snap.watch.probe_s or 0.0)
            lines.append(f"{slow} at the last watch cycle (interval {spec.watch.interval:g} s)")
        if sight.probe.error is not None:
            state, procs = "unknown", "?"
            lines.append(f"{name}: state unknown - {spec.host}: {sight.probe.error}")
            tone = Status.ERROR
        else:
            state = sight.word or ("running" if sight.probe.count > 0 else "stopped")
            procs = f"{sight.probe.count}/{sight.expected}"
            if sight.line:
                lines.append(sight.line)
            if not sight.healthy and tone is Status.OK:
                tone = Status.WARNING
        uptime = fmt.duration(sight.uptime_s) if sight.uptime_s else ""
        if sight.uptime_s is None and state == "running" and snap.launched_at is not None:
            uptime = fmt.duration(now - snap.launched_at)
        latest, last = snap.latest, ""
        if latest:
            ago = f"{fmt.duration(now - latest.created_at)} ago"
            last = f"{latest.id} {latest.action} {ago} by {who(latest.requested_by)}: {_run_outcome(latest)}"
        held = Holder.from_hash(snap.scope, snap.lock_holder) if snap.lock_held and snap.lock_holder else None
        lock = f"{held.action} by {who(held.user)}, at {held.step}" if held else ""
        actor = latest.requested_by if latest is not None and latest.action in ("start", "restart") else None
        owners = job_owners(config, name, actor)
        if owners:  # their alerts page them
            lines.append(f"{name} is owned by {', '.join(words.mention(o) for o in owners)}")
        if snap.incident is not None and (escalation := next_step_line(snap.incident, config, now)):
            lines.append(f"{name}: {escalation}")
        cells = (name, state, sight.who or snap.pid, procs, uptime, last, lock, ", ".join(snap.patches))
        rows.append(tuple(cell or "-" for cell in cells))
    failure = await ctx.redis.open_store(Posts).last_failure()  # written by the Slack outbox
    if failure.get("line"):
        try:
            ago = f"{fmt.duration(now - float(failure.get('at', now)))} ago"
        except ValueError:
            ago = "?"
        lines.append(f"last Slack delivery failure {ago}: {failure['line']}")
    lost = await ctx.redis.open_store(UndeliveredAlerts).last()
    if lost is not None:
        ago = f"{fmt.duration(now - lost.at)} ago"  # and who got the alert instead
        shown = [words.mention(t) if t.startswith(("U", "W")) else f"<#{t}>" for t in lost.told]
        instead = f"went to {', '.join(shown)} instead" if lost.told else "reached no one"
        lines.append(
            f"last undelivered alert {ago}: {lost.title} - {lost.error}"
            f"{f' in <#{lost.channel}>' if lost.channel else ''}, {instead}"
        )
    kept = await ctx.redis.persistence()
    how = "every write, fsynced each second (append-only file)" if kept.aof else "at snapshots only"
    where, saved = kept.where or ctx.redis.description, _when(config, kept.last_save)
    lines.append(f"state in {where}: persisted {how}; last snapshot {saved}")
    return Reply(
        title=f"status of {len(names)} job{'s' if len(names) != 1 else ''}",
        status=tone,
        tables=(Table(words.STATUS_HEADERS, tuple(rows)),),
        lines=tuple(lines),
    )


async def logs_command(ctx: Context, job: str, lines: int) -> Reply:
    """``logs JOB [N]``: the last N lines of the job's log; :class:`RemoteError` if it cannot be read."""
    text = await ctx.restarter.on_job(job, lambda e, t: e.log_tail(t, lines))
    title = words.logs_title(lines, ctx.config.jobs[job].log, job)
    if not text.strip():
        return Reply(title=title, lines=(f"the log of {job} is empty or missing",))
    return Reply(title=title, log=text)


async def patches_command(ctx: Context, job: str) -> Reply:
    """``patches JOB``: the configured patches and those in effect in the workdir now (``git apply
    --reverse --check`` on the host; if it cannot be reached, the set the last restart recorded)."""
    spec = ctx.config.jobs[job]
    lines: list[str] = []
    tone = Status.INFO
    try:
        in_effect = list(await ctx.restarter.patches_in_effect(job))
    except RemoteError as exc:
        in_effect = sorted(await ctx.service.records.stored_patches(job))
        lines.append(
            f"could not check the workdir ({exc.message}) - showing the set recorded by the last restart"
        )
        tone = Status.WARNING
    hashes = []
    for name, path in spec.patches.items():  # what an approval would name: the file's bytes now
        try:
            hashes.append(f"{name} {(await asyncio.to_thread(patch_digest, name, path)).sha256[:12]}")
        except (OSError, UnicodeDecodeError) as exc:
            lines.append(f"patch {name} cannot be read here, so it has no hash: {exc}")
    fields = [
        (words.FIELD_AVAILABLE, ", ".join(spec.patches) if spec.patches else "none configured"),
        (words.FIELD_IN_EFFECT, ", ".join(in_effect) if in_effect else "none"),
    ]
    fields += [(words.FIELD_SHA256, ", ".join(hashes))] if hashes else []
    return Reply(title=f"patches of {job}", status=tone, fields=tuple(fields), lines=tuple(lines))


async def checkpoints_command(ctx: Context, job: str) -> Reply:
    """``checkpoints JOB``: the job's ``step-NNNNNN`` checkpoints, newest first (step, time, size,
    files, verified or what is damaged); WARNING when the newest is damaged, ERROR when the host
    cannot be asked."""
    spec = ctx.config.jobs[job]
    if spec.checkpoint_dir is None:
        return Reply(title=words.checkpoints_none_configured(job), status=Status.INFO)
    try:
        found = await ctx.restarter.checkpoints(job)
    except RemoteError as exc:
        return Reply(
            title=words.checkpoints_unreadable(job, exc.message),
            status=Status.ERROR,
            exit_code=ExitCode.FAILED,
        )
    if not found:
        return Reply(title=words.checkpoints_none(job, spec.checkpoint_dir), status=Status.INFO)
    rows = tuple(
        (
            str(c.step),
            _when(ctx.config, c.time) if c.time is not None else "?",
            fmt.size(c.bytes),
            str(c.files),
            words.checkpoint_state(c.verified, damage_text(c.damage) if c.damage else None),
        )
        for c in found
    )
    intact = [c.step for c in found if c.intact]
    return Reply(
        title=words.checkpoints_title(job, spec.checkpoint_dir, len(found), intact),
        status=Status.OK if found[0].intact else Status.WARNING,
        tables=(Table(words.CHECKPOINT_HEADERS, rows),),
    )


async def lock_command(ctx: Context, job: str) -> Reply:
    """``lock JOB``: who holds the job's restart lock, since when, which step."""
    h = await ctx.service.locks.holder(scope_of(ctx.config, job))
    if h is None:
        return Reply(title=words.lock_free(job), status=Status.OK)
    run = ((words.FIELD_RUN, h.run_id),) if h.run_id else ()
    fields = ((words.FIELD_SINCE, _when(ctx.config, h.started_at)), *run)
    return Reply(
        title=words.lock_held(h.scope, h.action, h.job, h.user, h.age(), h.step, h.run_id),
        status=Status.WARNING,
        fields=fields,
        run_id=h.run_id or None,
    )


async def unlock_command(ctx: Context, job: str, user: str) -> tuple[Reply, Holder | None]:
    """``unlock JOB`` (admin): force the lock free; the holder's run learns it lost the lock.
    Returns the reply and who held the lock (None if it was free)."""
    scope = scope_of(ctx.config, job)
    holder = await ctx.service.locks.force_release(scope)
    if holder is None:
        return Reply(title=words.unlock_not_held(scope), status=Status.INFO), None
    if holder.run_id:
        channel = ctx.config.channel_for(holder.job) if holder.job in ctx.config.jobs else None
        key = thread_key(holder.run_id)
        await ctx.outbox.thread(
            key, Reply(title=words.lock_forced_note(user), status=Status.WARNING, thread_key=key), channel
        )
    return Reply(title=words.unlocked(scope, user, holder.user), status=Status.WARNING), holder


async def history_command(ctx: Context, audit: Audit, job: str | None, count: int) -> Reply:
    """``history [JOB] [N]``: the last N runs (run id, when, who, action, patches, verdict,
    duration), newest first, and the recent denied/refused/failed requests from the audit trail."""
    config, recent = ctx.config, min(count, _MAX_REFUSALS)
    runs = await ctx.runs.recent(job, count)
    rows = []
    for run in runs:
        end = run.finished_at or run.launched_at
        rows.append(
            (
                run.id,
                _when(config, run.created_at),
                words.actor_text(run.actor, run.requested_by)
                + (f" + {words.actor_text(run.approver, run.approved_by)}" if run.approved_by else ""),
                run.action + (f" ({words.HISTORY_BREAK_GLASS})" if run.break_glass else ""),
                ", ".join(run.patches) or "-",
                run.verdict_line or _run_outcome(run),
                fmt.duration(end - run.created_at) if end else "-",
            )
        )
    follow_ups = []
    for outcomes, title, headers in (
        (REFUSALS, words.HISTORY_REFUSALS_TITLE, words.HISTORY_REFUSAL_HEADERS),
        (APPROVALS, words.HISTORY_APPROVALS_TITLE, words.HISTORY_APPROVAL_HEADERS),
    ):
        if entries := await audit.recent(job=job, outcomes=outcomes, count=recent):
            rows_of = tuple(_audit_row(config, e, approvals=outcomes is APPROVALS) for e in entries)
            follow_ups.append(Reply(title=title, tables=(Table(headers, rows_of),)))
    return Reply(
        title=words.history_title(job, len(runs)),
        tables=(Table(words.HISTORY_HEADERS, tuple(rows)),) if rows else (),
        lines=() if rows else (f"no restarts{f' of {job}' if job else ''} recorded yet",),
        follow_ups=tuple(follow_ups),
    )


def attempt_rows(
    attempts: list[RunRecord], timezone: str, *, live: str | None = None
) -> tuple[tuple[str, ...], ...]:
    """One row per attempt, newest first: run, started, resumed at, reached, steps/s, how it ended,
    steps lost (what the restart after it lost of its work: the next attempt's ``lost``).

    :param attempts: the job's attempts, newest first.
    :param live: the id of the attempt running now (``running`` in its "ended" column).
    """
    rows = []
    for i, run in enumerate(attempts):
        reach = run.reach
        newer = attempts[i - 1] if i > 0 else None
        lost = newer.lost if newer is not None and newer.previous_run == run.id else None
        rows.append(
            (
                run.id,
                fmt.clock(run.launched_at, timezone) if run.launched_at is not None else NA,
                fmt.number(run.resumed_at, "{:,}"),
                fmt.number(reach.step if reach else None, "{:,}"),
                fmt.number(reach.steps_per_s if reach else None, "{:.2f}"),
                "running"
                if run.id == live and reach is None
                else (reach.ended if reach and reach.ended else NA),
                fmt.number(lost, "{:,}"),
            )
        )
    return tuple(rows)


async def attempts_command(ctx: Context, job: str | None, count: int) -> Reply:
    """``history JOB --attempts``: the job's last ``count`` attempts, one row each (:func:`attempt_rows`).

    :param job: a configured job (the verb needs one with ``--attempts``).
    :returns: the table, or an ERROR reply (usage) without a job.
    """
    if job is None:
        return refused(words.ATTEMPTS_NEED_JOB)
    attempts = await ctx.runs.attempts(job, count)
    live = (await ctx.service.jobs.read(job)).run_id
    title = f"history of {job}: last {len(attempts)} attempt{'s' if len(attempts) != 1 else ''}"
    if not attempts:
        return Reply(title=title, lines=(f"{job} has not been launched by Pitstop yet",))
    rows = attempt_rows(attempts, ctx.config.scheduler.timezone, live=live)
    return Reply(
        title=title,
        lines=tuple(line for line in [await _attempts_goodput(ctx, job, attempts)] if line),
        tables=(Table(words.ATTEMPT_HEADERS, rows),),
    )


async def _attempts_goodput(ctx: Context, job: str, attempts: list[RunRecord]) -> str | None:
    """Goodput from the launch of the oldest attempt shown (at most :data:`DAY_S` ago) to now."""
    now = time.time()
    launched = [a.launched_at for a in attempts if a.launched_at is not None]
    if not launched:
        return None
    start = max(min(launched), now - DAY_S)
    oldest = next(a.id for a in reversed(attempts) if a.launched_at is not None)
    over = f"since {oldest}'s launch" if start == min(launched) else None
    name = ctx.config.job_name(job)
    runs = await ctx.runs.recent(name, GOODPUT_RUNS)
    g = await job_goodput(ctx.redis, name, ctx.config.jobs[name], runs, start=start, end=now)
    return goodput_line(g, over)


def _audit_row(config: Config, e: AuditEntry, *, approvals: bool) -> tuple[str, ...]:
    """A refused request's row in ``history``, or an approval decision's."""
    if approvals:
        return (
            _when(config, e.ts),
            e.run_id or "-",
            words.actor_text(e.actor, e.user),
            e.outcome.value,
            e.detail[:200],
        )
    detail = e.detail.splitlines()[0][:120] if e.detail else ""
    return (_when(config, e.ts), words.actor_text(e.actor, e.user), e.text[:80], e.outcome.value, detail)


EXAMPLE_JOB = "dflash"  #: the job the grammar's examples name (the reference pipeline)


def help_command(command: Command, *, typed: str = "", jobs: Sequence[str] = ()) -> Reply:
    """``help [VERB]``: every verb's usage, what it does and the role it needs; or one verb's
    usage lines and examples.  Derived from the command table (:data:`handlers.grammar.parse.GRAMMAR`).

    :param typed: what comes before a verb on the surface (``/train `` in Slack, nothing in the console).
    :param jobs: the configured jobs: examples name the first (``stop tj``) unless the reference
        job :data:`EXAMPLE_JOB` is one of them.
    """
    topic = command.topic
    if topic is not None:
        spec = grammar.VERBS[topic]
        lines = [spec.summary, f"needs the {spec.role.label} role"]
        job = EXAMPLE_JOB if not jobs or EXAMPLE_JOB in jobs else jobs[0]
        examples = [re.sub(rf"\b{EXAMPLE_JOB}\b", job, e) for e in spec.examples]
        if examples:
            lines.append("examples: " + "; ".join(f"`{e}`" for e in examples))
        return Reply(title=f"usage: {spec.usage}", lines=tuple(lines))
    lines = [f"`{spec.usage}` - {spec.summary} ({spec.role.label})" for spec in grammar.GRAMMAR]
    lines.append(
        f"type `{typed}help VERB` for one command; names ignore case; roles: viewer < operator < admin"
    )
    return Reply(title=words.HELP_TITLE, lines=tuple(lines))


# --- follow r-N: a run's steps as they happen, then its verdict, from any process ----------------

FOLLOW_SLACK = 420.0  #: seconds a follow waits beyond the job's stop timeout and start window


def followed(text: str, config: Config) -> str | None:
    """The run ``text`` asks to follow (``follow r-7`` → ``r-7``); None for anything else."""
    try:
        command = parse(text, config)
    except ParseError:
        return None
    return command.run_ref if command.verb == "follow" else None


def ended(run: RunRecord) -> bool:
    """The run has its verdict, or its sequence ended with nothing launched (a stop)."""
    return run.verdict is not None or (run.finished_at is not None and not run.launched)


def within(config: Config, job: str) -> float:
    """Seconds a follow of a run of ``job`` waits at most: its stop timeout, start window and :data:`FOLLOW_SLACK`."""
    spec = config.jobs.get(job)
    return FOLLOW_SLACK + (spec.stop_timeout + spec.start_window if spec else 0.0)


async def follow_command(ctx: Context, run_id: str) -> Reply:
    """``follow r-N``: the run's message as it is now.

    :raises UnknownRun: if there is no such run.
    """
    return run_reply(await ctx.runs.get(run_id), ctx.config)


def fresh(run: RunRecord, seen: set[StepLine]) -> list[StepLine]:
    """The run's step lines (:func:`~handlers.runs.view.step_lines`) not in ``seen``, now added to it."""
    steps = [s for s in step_lines(run) if s not in seen]
    seen.update(steps)
    return steps


async def follow_run(ctx: Context, run_id: str, *, deliver: bool = True) -> AsyncIterator[RunRecord]:
    """The run now and after each of its events (or a quiet wait of at most
    :data:`~pipeline.state.events.BLOCK_S` s, or until its verification is due), until it
    :func:`ended` or for at most :func:`within` s.

    :param deliver: deliver a verification due here (verify, post, publish) unless another process
        has it; False where this process's scheduler does (the console, whose posts it prints).

    :raises UnknownRun: if there is no such run.
    """
    run, cursor = await ctx.runs.get(run_id), "0-0"
    deadline = time.monotonic() + within(ctx.config, run.job)
    while True:
        yield run
        if ended(run) or time.monotonic() > deadline:
            return
        due = await ctx.service.queue.due_at(run_id)
        if not deliver or due is None or due > time.time() or await ctx.service.deliver(run_id) is None:
            wait = BLOCK_S if due is None or due <= time.time() else due - time.time()
            if events := await ctx.events.read_run(run_id, cursor, wait):
                cursor = events[-1].id
        run = await ctx.runs.get(run_id)
