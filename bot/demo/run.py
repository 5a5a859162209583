"""``pitstop demo``: the whole product on this machine, on real parts: embedded Redis, an
in-process SSH host, the reference DFlash pipeline in a temporary git workdir, the scheduler, and
the console chat (or Slack over Socket Mode when both Slack tokens are set).  Nothing is left running.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import signal
import string
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

from bot.console.chat import ConsoleOutbox, ConsoleSession, make_console
from bot.console.identity import cli_identity
from bot.demo.script import Kill, Say, Step, Wait, WaitRanks, parse_line, parse_script
from bot.runtime.assembly import build_context, close_context
from bot.runtime.scheduler import PitstopScheduler
from bot.runtime.settings import Settings
from bot.text import (
    demo_dirs,
    demo_done,
    demo_script_unreadable,
    demo_unexpected,
    demo_wait_timed_out,
    embedded_redis_started,
)
from devhost.sshhost import LocalSSHHost, start_local_ssh_host
from handlers.context import Context
from handlers.request.dispatch import Dispatcher
from pipeline.config import HostConfig, load_config
from pipeline.digest.window import MAX_WINDOW_BYTES, remote_reader
from pipeline.errors import ExitCode, PitstopError, UsageError
from pipeline.observe.metrics import parse_metric_lines
from pipeline.state.events import EventKind

DEMO_USER = "U0DEMO"  #: the demo's admin: the Slack id ``[auth.cli]`` maps the OS user running it to
#: where the demo's digest charts are kept, under the working directory: the printed chart paths
#: stay valid after the demo, whose temp dir (state, Redis, checkpoints) is deleted unless --keep
DEMO_CHARTS = "pitstop-demo-charts"
DEFAULT_SCRIPT = Path(__file__).resolve().parents[2] / "demo" / "script.txt"
CONFIG_TEMPLATE = Path(__file__).with_name("config.toml")  #: the demo's config, ``$``-placeholders filled in
#: the demo's windows in seconds: ``start_window`` (the launcher spawns its 8 workers before any
#: torch import, so they are up within seconds even on a loaded machine), ``watch_interval``,
#: ``digest_every``; shorter ones for tests from ``PITSTOP_DEMO_START_WINDOW`` etc.
WINDOWS = {"start_window": 10, "watch_interval": 1, "digest_every": 600}


def dflash_source() -> Path:
    """The reference pipeline shipped with Pitstop (package data of ``pipeline``)."""
    return Path(str(resources.files("pipeline") / "dflash"))


def deploy_dflash(workdir: Path) -> None:
    """Copy ``pipeline/dflash`` into ``workdir`` as its own git repository (one commit); raises
    :class:`subprocess.CalledProcessError` if git fails."""
    shutil.copytree(
        dflash_source(), workdir, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "patches")
    )
    env = {**os.environ}
    for who in ("AUTHOR", "COMMITTER"):
        env[f"GIT_{who}_NAME"], env[f"GIT_{who}_EMAIL"] = "pitstop demo", "demo@pitstop.invalid"
    for argv in (["git", "init", "-q"], ["git", "add", "-A"], ["git", "commit", "-qm", "dflash as deployed"]):
        subprocess.run(argv, cwd=workdir, check=True, env=env, capture_output=True)


def demo_config_text(hc: HostConfig, *, workdir: Path, state_dir: Path, python: str, os_user: str) -> str:
    """The demo's TOML config: host ``local`` (``hc``), job ``dflash`` (5 target + 3 drafter CPU
    processes, tiny sizes), its windows :data:`WINDOWS` (or ``PITSTOP_DEMO_…``); ``[auth.cli]``
    maps ``os_user`` (who runs the demo) to the admin :data:`DEMO_USER`."""
    log = workdir / "train.log"
    launch = ["/usr/bin/env", f"PYTHON={python}", "./run.sh", "--cpu", "--profile", "tiny", "--log", str(log)]
    # checkpoint every 20 drafter steps: a kill loses fewer than 20, and the restart says how many
    launch += ["--checkpoint-dir", str(workdir / "checkpoints"), "--checkpoint-every", "20"]
    return string.Template(CONFIG_TEMPLATE.read_text()).substitute(
        hc.model_dump(),  # address, port, known_hosts
        admin=DEMO_USER,
        os_user=os_user,
        state_dir=state_dir,
        user=hc.user or "",
        client_key=hc.client_keys[0],
        workdir=workdir,
        launch=", ".join(f'"{a}"' for a in launch),
        log=log,
        patches=dflash_source() / "patches",
        **_windows(),
    )


def kill_session(sid: int) -> int:
    """SIGKILL every process of session ``sid`` (from outside, as a kill -9 would); return how many.

    Its process group (the session leader's) is killed in one ``killpg``, so no worker outlives its
    launcher long enough to see it gone and log a traceback; then any other member of the session.
    """
    members = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):  # gone since it was listed
            if os.getsid(int(entry)) == sid:
                members.append(int(entry))
    with contextlib.suppress(ProcessLookupError):
        os.killpg(sid, signal.SIGKILL)
    for pid in members:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return len(members)


class DemoFailed(PitstopError):
    """A demo step did not behave as expected; exits with the step's own exit code."""

    code = "demo_failed"

    def __init__(self, message: str, exit_code: ExitCode = ExitCode.FAILED) -> None:
        super().__init__(message)
        self.exit_code = exit_code


async def demo_main(args: argparse.Namespace, env: Settings) -> int:
    """Run the demo; 0 when every step behaved as expected, else the failing step's exit code."""
    script: list[Step] | None = None
    if args.script:
        try:
            text = await asyncio.to_thread(Path(args.script).read_text)
        except OSError as exc:
            raise UsageError(demo_script_unreadable(args.script, exc.strerror or str(exc))) from None
        script = parse_script(text)
    elif args.say:
        script = [s for n, t in enumerate(args.say, 1) if (s := parse_line(t, n)) is not None]
    elif not sys.stdin.isatty() and not (env.bot_token and env.app_token):
        script = parse_script(await asyncio.to_thread(DEFAULT_SCRIPT.read_text))

    console = make_console()
    tmp = Path(tempfile.mkdtemp(prefix="pitstop-demo-"))
    started = time.monotonic()
    host: LocalSSHHost | None = None
    ctx: Context | None = None
    scheduler: PitstopScheduler | None = None
    try:
        charts = Path.cwd() / DEMO_CHARTS
        charts.mkdir(exist_ok=True)
        (tmp / "state").mkdir()
        (tmp / "state" / "charts").symlink_to(charts, target_is_directory=True)  # digests resolve it
        console.print(demo_dirs(tmp, charts), style="dim", markup=False)
        # the interpreter's bin dir on the host's PATH: py-spy (installed with Pitstop) dumps the hung rank
        host = await start_local_ssh_host(tmp / "ssh", path_prepend=[Path(sys.executable).parent])
        workdir = tmp / "dflash"
        await asyncio.to_thread(deploy_dflash, workdir)
        config_path = tmp / "pitstop.toml"
        config_text = demo_config_text(
            host.host_config(),
            workdir=workdir,
            state_dir=tmp / "state",
            python=sys.executable,
            os_user=env.os_user,
        )
        config_path.write_text(config_text)
        config = load_config(config_path)
        ctx = await build_context(config, ConsoleOutbox(console))
        console.print(embedded_redis_started(str(config.state.path / "redis")), style="dim", markup=False)
        scheduler = PitstopScheduler(ctx)
        await scheduler.start()
        dispatcher = Dispatcher(ctx)
        session = ConsoleSession(dispatcher, who=cli_identity(config, env.os_user), console=console)

        cursor = await ctx.events.last_id()
        await _say(session, "start dflash", 0)
        await _wait(ctx, Wait(EventKind.VERDICT, "dflash", 180, 0), cursor)

        if script is None and env.bot_token and env.app_token:
            from bot.runtime.serve import serve  # lazy: Slack's libraries only when tokens hand over to Slack

            # Slack takes over: its runtime runs the scheduler (and posts to Slack, not here)
            await scheduler.stop()
            scheduler = None
            await serve(config, bot_token=env.bot_token, app_token=env.app_token, api_url=env.api_url)
            return 0
        if script is None:
            return await session.repl()
        await _run_script(ctx, session, script, scheduler)
        console.print(demo_done(len(script), time.monotonic() - started))
        return 0
    except PitstopError as exc:
        console.print(f"[bold red]{exc.message}[/bold red]")
        return int(exc.exit_code)
    finally:
        keep = getattr(args, "keep", False)
        with contextlib.suppress(Exception):
            if scheduler is not None:
                await scheduler.stop()
        if ctx is not None:
            sid: int | None = None
            with contextlib.suppress(Exception):
                sid = await _session_of(ctx, "dflash")
            if keep:  # a graceful stop first: a last checkpoint for the kept dir
                with contextlib.suppress(Exception):
                    run = await ctx.runs.create("dflash", DEMO_USER, action="stop")
                    await asyncio.wait_for(ctx.restarter.stop(run), timeout=90)
            if sid is not None:
                # then whatever is left, the hard way: without --keep the temp dir is deleted next
                kill_session(sid)
            with contextlib.suppress(Exception):
                await close_context(ctx)
        if host is not None:
            with contextlib.suppress(Exception):
                await host.close()
        if not keep:
            shutil.rmtree(tmp, ignore_errors=True)


def _windows() -> dict[str, float]:
    """:data:`WINDOWS`, each replaced by its ``PITSTOP_DEMO_START_WINDOW`` etc. when set (tests)."""
    names = {k: f"PITSTOP_DEMO_{k.upper()}" for k in WINDOWS}
    return {k: float(os.environ[names[k]]) if os.environ.get(names[k]) else v for k, v in WINDOWS.items()}


async def _say(session: ConsoleSession, text: str, lineno: int) -> None:
    reply = await session.run_line(text)
    if reply.exit_code != ExitCode.OK:
        raise DemoFailed(demo_unexpected(lineno, f"{text!r} answered {reply.title!r}"), reply.exit_code)


async def _wait(ctx: Context, step: Wait, cursor: str) -> None:
    event = await ctx.events.wait_for(step.kind, step.job, after=cursor, timeout=step.within)
    if event is None:
        raise DemoFailed(demo_wait_timed_out(step.kind.value, step.job, step.within), ExitCode.CANCELLED)
    if step.kind is EventKind.VERDICT and event.data.get("verdict") != "RUNNING":
        raise DemoFailed(demo_unexpected(step.lineno, f"verdict {event.data.get('line')}"))


RANKS_POLL = 1.0  #: seconds between reads of the metric log while waiting for every rank


async def _wait_ranks(ctx: Context, step: WaitRanks) -> None:
    """Until each of the job's ``processes`` ranks wrote a metric line since its last launch."""
    name = ctx.config.job_name(step.job)
    spec = ctx.config.jobs[name]
    read = remote_reader(ctx.ssh, name, spec)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + step.within
    while True:
        run = next((r for r in await ctx.runs.recent(name, 5) if r.log_size_at_launch is not None), None)
        offset = (run.log_size_at_launch or 0) if run is not None else 0
        chunk = await read(offset, MAX_WINDOW_BYTES)
        seen = {line.rank for line in parse_metric_lines(chunk.data, spec.metrics)}
        if len(seen) >= spec.processes:
            return
        if loop.time() >= deadline:
            raise DemoFailed(
                demo_wait_timed_out(f"ranks ({len(seen)}/{spec.processes} seen)", step.job, step.within),
                ExitCode.CANCELLED,
            )
        await asyncio.sleep(RANKS_POLL)


#: what a ``wait`` directive waits for, as its line says it
_AWAITED = {
    EventKind.VERDICT: "the verdict",
    EventKind.ALERT: "an alert",
    EventKind.RESOLVED: "the resolution",
    EventKind.DIGEST: "a digest",
}


async def _session_of(ctx: Context, job: str) -> int | None:
    """The session id recorded for ``job``'s processes, or None."""
    sid = (await ctx.service.jobs.read(job)).current.get("sid")
    return int(sid) if sid else None


async def _run_script(
    ctx: Context, session: ConsoleSession, steps: Sequence[Step], scheduler: PitstopScheduler | None = None
) -> None:
    cursor = await ctx.events.last_id()
    for step in steps:
        if isinstance(step, Say):
            session.console.print(f"\n[bold]> {step.text}[/bold]")
            cursor = await ctx.events.last_id()
            await _say(session, step.text, step.lineno)
        elif isinstance(step, Wait):
            session.console.print(
                f"[dim]… waiting for {_AWAITED.get(step.kind, step.kind.value)} of {step.job} (≤ {step.within:g} s)[/dim]"
            )
            await _wait(ctx, step, cursor)
            if scheduler is not None and step.kind in (EventKind.ALERT, EventKind.RESOLVED):
                await scheduler.watcher.teller.told(30)  # shown before the next command is typed
        elif isinstance(step, WaitRanks):
            session.console.print(
                f"[dim]… waiting for every rank of {step.job} to report (≤ {step.within:g} s)[/dim]"
            )
            await _wait_ranks(ctx, step)
        elif isinstance(step, Kill):
            cursor = await ctx.events.last_id()
            if (sid := await _session_of(ctx, step.job)) is None:
                raise UsageError(demo_unexpected(step.lineno, f"no recorded session for {step.job}"))
            n = kill_session(sid)
            session.console.print(
                f"\n> kill {step.job}: SIGKILL to {n} processes of session {sid}", style="bold red"
            )
