"""Reports: throughput digests (``digest [JOB]``) and a host's GPUs (``gpus HOST``).

The scheduler calls :func:`digest_command` with ``scheduled=True`` and posts the reply to the job's
channel; a person's ``digest`` moves no offset (:mod:`pipeline.digest.report`).  Expected failures
(host unreachable, log missing, nvidia-smi absent) become a reply saying so, never a traceback.
"""

from __future__ import annotations

from collections.abc import Sequence

from handlers import text as words
from handlers.context import Context
from handlers.grammar.commands import close_names
from handlers.reply import Reply, Status, Table, refused
from handlers.views.read import NA, attempt_rows
from pipeline import fmt
from pipeline.digest.goodput import goodput_line
from pipeline.digest.report import Digest, build_digest
from pipeline.digest.stats import DigestSummary
from pipeline.errors import ExitCode, PitstopError, RemoteError
from pipeline.observe.gpus import (
    QUERY_GPU_ARGV,
    ComputeApp,
    GpuStat,
    compute_apps,
    parse_query_gpu,
    query_gpus,
)
from pipeline.observe.metrics import TARGET


def _change(change: dict[str, float], key: str) -> str:
    pct = change.get(key)
    return f" ({fmt.signed_pct(pct)})" if pct is not None else ""


def _step_time(digest: Digest) -> str:
    """Pipeline (drafter) step time with its change, then the targets' own (they include queue waits)."""
    s = digest.summary
    text = f"{_secs(s.step_p50)} / {_secs(s.step_p95)}" + _change(digest.change, "step_p50")
    targets = s.role(TARGET)
    if targets is not None:
        text += f"; targets {_secs(targets.step_p50)} / {_secs(targets.step_p95)}"
    return text


def _has_step_time(s: DigestSummary) -> bool:
    """Whether any line of the window had a ``step_time_s``, the pipeline's or the targets'."""
    return s.step_p50 is not None or any(r.step_p50 is not None for r in s.roles)


def _topk(s: DigestSummary, change: dict[str, float]) -> str:
    """Top-1/4/8 accuracy in percent (the mean of each drafter rank's last line), with their changes."""
    keys = ("top1", "top4", "top8")
    shown = " / ".join(fmt.number(v, "{:.1%}") for v in (s.top1, s.top4, s.top8))
    moved = " / ".join(fmt.signed_pct(change[k]) if k in change else NA for k in keys)
    return f"{shown} (each drafter's last line)" + (f" ({moved})" if any(k in change for k in keys) else "")


def digest_reply(digest: Digest, timezone: str = "UTC") -> Reply:
    """The reply for a built digest: headline with ±%, fields, per-rank and per-GPU tables, chart.

    :param digest: from :func:`pipeline.digest.report.build_digest`.
    :param timezone: how the attempts' start times are shown (``[scheduler] timezone``).
    :returns: the reply (``status`` WARNING when drafters are starved, no metric lines were
        found, or GPU data is missing).
    """
    s = digest.summary
    w = digest.window
    skipped = (
        f"{fmt.size(w.skipped)} of metric log written since the last digest were not read "
        f"(a digest reads the last {fmt.size(digest.max_bytes)} at most)"
    )
    empty = words.digest_empty(digest.job, s.bytes_read, digest.path, digest.empty_why)
    silent = "; ".join(
        f"rank {q.rank} ({q.role}) {words.digest_silent_cell(q.last_seen)}" for q in digest.silent
    )
    notes = (  # (a line or None, whether it makes the digest a warning)
        (goodput_line(digest.goodput) if digest.goodput is not None else None, False),
        (words.digest_window_note(w.kind.value, digest.path, digest.max_bytes), False),
        (skipped if w.skipped and w.kind.value == "since_last" else None, False),
        (empty if not s.metric_lines else None, True),
        (words.digest_reported(s.window_start is not None) if s.reported else None, False),
        (words.digest_starved(s.queue_mean) if s.starved and s.queue_mean is not None else None, True),
        (f"{silent}: no metric line in this window" if digest.silent else None, True),
        (words.digest_resets(s.resets) if s.resets else None, False),
        (digest.gpu_note or None, True),
    )
    lines = [line for line, _ in notes if line]
    warn = any(warns for line, warns in notes if line)
    targets = s.role(TARGET)
    fields: list[tuple[str, str]] = [
        ("uptime", fmt.duration(digest.uptime_s)),
        ("restarts", _restarts(digest.restarts)),
        ("window", _window(s.window_start, s.window_end, s.bytes_read, w.skipped)),
    ]
    if targets is not None:
        fields.append(("targets", words.digest_targets(s.target_tokens_per_s, targets.ranks)))
    # a row the window's lines have nothing for is left out (a generic job has no queue, no top-k)
    loss = f"{fmt.number(s.loss_last, '{:.3f}')} last, {fmt.number(s.loss_mean, '{:.3f}')} mean"
    fields += [
        (label, value)
        for label, value, has in (
            ("samples/s", fmt.number(s.samples_per_s), s.samples_per_s is not None),
            ("step time p50/p95", _step_time(digest), _has_step_time(s)),
            (
                "queue depth",
                f"mean {fmt.number(s.queue_mean, '{:.1f}')}, max {fmt.number(s.queue_max)}",
                s.queue_max is not None,
            ),
            ("loss", loss, s.loss_mean is not None),
            (
                "top-1/4/8",
                _topk(s, digest.change),
                any(v is not None for v in (s.top1_mean, s.top4_mean, s.top8_mean)),
            ),
        )
        if has
    ]
    if digest.progress is not None:
        fields.append(("progress", words.digest_progress(digest.progress)))
    tables = []
    if s.ranks or digest.silent:
        rows = [
            (r.rank, str(r.rank), r.role, r.device or NA, fmt.number(r.tokens_per_s), _secs(r.step_p50))
            for r in s.ranks
        ]
        rows += [
            (q.rank, str(q.rank), q.role, NA, words.digest_silent_cell(q.last_seen), NA)
            for q in digest.silent
        ]
        rank_rows = tuple(row[1:] for row in sorted(rows))
        tables.append(Table(("rank", "role", "device", "tokens/s", "step p50"), rank_rows))
    if digest.gpus:
        gpu_rows = tuple((str(g.index), g.role, *_gpu_use(g)) for g in digest.gpus)
        tables.append(Table(("gpu", "role", "util", "memory used/total", "power"), gpu_rows))
    if digest.attempts:  # the footer: one row per attempt
        tables.append(
            Table(words.ATTEMPT_HEADERS, attempt_rows(list(digest.attempts), timezone, live=digest.live_run))
        )
    tps = s.pipeline_tokens_per_s
    if tps is not None:  # digest dflash: 1,234 tokens/s (+5.2%)
        title = f"digest {digest.job}: {tps:,.0f} tokens/s{_change(digest.change, 'pipeline_tokens_per_s')}"
    elif s.samples_per_s is not None:
        title = f"digest {digest.job}: {s.samples_per_s:,.0f} samples/s"
    else:
        title = f"digest {digest.job}: no throughput in this window"
    return Reply(
        title=title,
        status=Status.WARNING if warn else Status.OK,
        lines=tuple(lines),
        fields=tuple(fields),
        tables=tuple(tables),
        chart=str(digest.chart) if digest.chart else None,
    )


def _gpu_use(g: GpuStat, used: str | None = None) -> tuple[str, str, str]:
    """A GPU's util, memory used/total (or, given a format, used only) and power cells."""
    if used is not None:
        memory = fmt.number(g.memory_used_mib, used, " MiB")
    elif g.memory_used_mib is None and g.memory_total_mib is None:
        memory = NA
    else:
        memory = f"{fmt.number(g.memory_used_mib)} / {fmt.number(g.memory_total_mib)} MiB"
    return fmt.number(g.utilization_pct, "{:.0f}", "%"), memory, fmt.number(g.power_w, "{:.0f}", " W")


async def _one_digest(ctx: Context, job: str, scheduled: bool) -> Reply:
    try:
        digest = await build_digest(
            job, config=ctx.config, redis=ctx.redis, ssh=ctx.ssh, events=ctx.events, scheduled=scheduled
        )
    except PitstopError as exc:
        title = f"digest {job}: could not be built - {exc.message}"
        return Reply(title=title, status=Status.ERROR, exit_code=exc.exit_code)
    return digest_reply(digest, ctx.config.scheduler.timezone)


async def digest_command(ctx: Context, job: str | None, *, scheduled: bool = False) -> Reply:
    """``digest [JOB]``: a throughput digest of one job (any case), or of every configured job: a
    short heading with one follow-up digest per job, each posted in its thread with its chart.

    :param scheduled: the scheduler's digest: moves the job's offset and stores the numbers the
        next digest compares against.  A person's digest is on demand (False).
    :returns: the reply; an unknown job is an ephemeral usage error with a did-you-mean.
    """
    names = list(ctx.config.jobs)
    if job is not None:
        try:
            name = ctx.config.job_name(job)
        except KeyError:
            return refused(words.unknown_name("job", job, close_names(job, names, 2)))
        return await _one_digest(ctx, name, scheduled)
    if not names:
        return Reply(title=words.DIGEST_NO_JOBS, status=Status.INFO)
    if len(names) == 1:
        return await _one_digest(ctx, names[0], scheduled)
    follow = [await _one_digest(ctx, name, scheduled) for name in names]
    worst = max((f.exit_code for f in follow), default=ExitCode.OK)
    warned = any(f.status is Status.WARNING for f in follow)
    return Reply(
        title=words.digest_all_title(len(names)),
        status=Status.ERROR if worst else Status.WARNING if warned else Status.OK,
        lines=tuple(f.title for f in follow),
        follow_ups=tuple(follow),
        exit_code=worst,
    )


# --- gpus HOST ----------------------------------------------------------------------------------


async def _pid_jobs(ctx: Context, host: str) -> dict[int, str]:
    """Host PIDs → job name, from each job's recorded pid/sid and its current process list."""
    jobs = [(n, j) for n, j in ctx.config.jobs.items() if j.host == host]
    snaps = await ctx.service.jobs.read_many([n for n, _ in jobs])
    ids = ((s.name, s.current.get(field)) for s in snaps if not s.stopped for field in ("pid", "sid"))
    owners = {int(value): name for name, value in ids if value and value.isdigit()}
    entries = [(name, spec, snap.current or None) for (name, spec), snap in zip(jobs, snaps, strict=True)]
    for name, sight in (await ctx.restarter.sightings(entries)).items():
        owners.update(dict.fromkeys((*sight.probe.session_pids, *sight.probe.pids), name))
    return owners


async def _job_gpus(ctx: Context, name: str) -> Reply | None:
    """``gpus JOB`` for a job whose run holds nodes of its own (a Slurm job): the GPUs of each,
    one table per node; None for a job its host answers for.

    :returns: a warning reply when the run holds no nodes now, an error reply when none answered.
    """
    try:
        answer = await ctx.restarter.on_job(name, lambda e, t: e.node_outputs(t, QUERY_GPU_ARGV))
    except RemoteError as exc:
        return Reply(
            title=words.gpus_unavailable(ctx.config.jobs[name].host, exc.message), status=Status.ERROR
        )
    except PitstopError as exc:
        return Reply(title=exc.message, status=Status.WARNING)
    if answer is None:
        return None
    tables: list[Table] = []
    lines: list[str] = []
    for node, text in answer.outputs.items():
        try:
            gpus = parse_query_gpu(text)
        except PitstopError as exc:
            lines.append(f"{node}: {exc.message}")
            continue
        rows = tuple((node, str(g.index), g.name, *_gpu_use(g, "{:,.0f}")) for g in gpus)
        tables.append(Table(("node", "gpu", "name", "util", "memory", "power"), rows))
    count, nodes = sum(len(t.rows) for t in tables), len(answer.outputs)
    return Reply(
        title=f"GPUs of {name} ({answer.who}): {count} on {nodes} node{'s' if nodes != 1 else ''}",
        status=Status.OK if not lines else Status.WARNING,
        lines=tuple(lines),
        tables=tuple(tables),
    )


async def gpus_command(ctx: Context, host: str) -> Reply:
    """``gpus HOST``: the host's GPUs (utilisation, memory, power) and the processes on them.

    Fields nvidia-smi reports as ``[N/A]`` / ``[Not Supported]`` show as ``n/a``.  Processes
    holding GPU memory are mapped to jobs by the jobs' recorded pid/session and their current
    process lists (host PIDs: processes inside a container show without a job).

    :param host: a configured host name (case-insensitive), or a job whose run holds nodes.
    :returns: the reply: one GPU table and a process table; an error reply when the host gave no
        GPU data.
    """
    try:
        name = ctx.config.host_name(host)
    except KeyError:
        job = next((j for j in ctx.config.jobs if j.lower() == host.lower()), None)
        if job is not None and (reply := await _job_gpus(ctx, job)) is not None:
            return reply
        return refused(words.unknown_name("host", host, close_names(host, ctx.config.hosts, 2)))
    try:
        gpus = await query_gpus(ctx.ssh, name)
    except PitstopError as exc:
        return Reply(
            title=words.gpus_unavailable(name, exc.message), status=Status.ERROR, exit_code=exc.exit_code
        )
    lines: list[str] = []
    apps: list[ComputeApp] | None
    try:
        apps = await compute_apps(ctx.ssh, name)
    except PitstopError as exc:
        apps = None
        lines.append(f"processes on the GPUs unknown: {exc.message}")
    tables = [
        Table(
            ("gpu", "name", "util", "memory used/total", "power"),
            tuple((str(g.index), g.name or NA, *_gpu_use(g)) for g in gpus),
        )
    ]
    if apps is not None and not apps:
        lines.append(words.GPUS_NO_PROCESSES)
    elif apps:  # where each process runs is not known: a table of its own
        owners = await _pid_jobs(ctx, name)
        rows = tuple(
            (str(a.pid), owners.get(a.pid, "-"), fmt.number(a.used_memory_mib, "{:,.0f}", " MiB"))
            for a in apps
        )
        tables.append(Table(("pid", "job", "gpu memory"), rows))
    return Reply(
        title=words.gpus_title(name, len(gpus)), status=Status.OK, lines=tuple(lines), tables=tuple(tables)
    )


def _window(start: float | None, end: float | None, read: int, skipped: int) -> str:
    """The window a digest covers: time span of its metric lines and bytes read."""
    span = (
        f"{fmt.duration(end - start)} ({fmt.clock(start, date=False)} to {fmt.clock(end, date=False)})"
        if start is not None and end is not None
        else "no timestamps"
    )
    more = f", {fmt.size(skipped)} earlier not read" if skipped else ""
    return f"{span}, {fmt.size(read)} read{more}"


def _secs(value: float | None) -> str:
    return fmt.number(value, "{:.3f}", " s")


def _restarts(ids: Sequence[str] | None) -> str:
    """Restarts during the window (None: unknown)."""
    if ids is None:
        return NA
    if not ids:
        return "none"
    return f"{len(ids)} ({', '.join(ids[:5])}{', …' if len(ids) > 5 else ''})"
