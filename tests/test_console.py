"""The console chat: rich rendering of replies, live posts by thread key, confirmation, non-interactive input."""

from __future__ import annotations

import asyncio
import io
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
from rich.console import Console

from bot.console.chat import (
    ConsoleOutbox,
    ConsoleSession,
    key_prefix,
    make_console,
    render,
    run_console,
)
from bot.console.identity import CliIdentity
from bot.runtime.assembly import build_context, close_context
from bot.slack import blocks
from bot.text import CONSOLE_BYE, CONSOLE_CONFIRM, console_awaiting, console_no_role
from handlers.context import Context
from handlers.reply import Button, Reply, Status, StepLine, Table
from handlers.request.dispatch import Dispatcher, Request
from handlers.runs.view import run_reply
from handlers.text import HELP_TITLE
from pipeline.config import AuthSettings, Config
from tests.fixtures.slack import kill_matching, slack_config
from tests.fixtures.ssh import InProcessHost, JobFactory, JobSetup


def _console() -> Console:
    return make_console(file=io.StringIO(), record=True, width=160)


def _restart_reply() -> Reply:
    return Reply(
        title="restart dflash (r-3) by U0OPERATOR1: RUNNING 8/8 processes pid 4242",
        status=Status.OK,
        steps=(
            StepLine("preflight", "ok", 0.2),
            StepLine("stop", "ok", 3.1, "8 processes stopped"),
            StepLine("clear_cache", "skipped"),
            StepLine("launch", "failed", 0.1, "exit 3"),
        ),
        lines=("patches: topk",),
        fields=(("pid", "4242"), ("uptime", "1 h 2 m")),
        tables=(Table(("rank", "tokens/s"), (("0", "1,412"), ("5", "980"))),),
        log="step 1 loss 2.0\nstep 2 loss 1.9\n",
        log_title="last 2 lines of /w/train.log",
        chart="/tmp/digest.png",
        buttons=(Button("Show log", "show_log", "dflash"),),
    )


def test_renderer_shows_every_part_of_a_reply() -> None:
    """Title, steps with ✓/✗/- and durations, lines, fields, table cells, log panel, chart path and buttons all print."""
    console = _console()
    console.print(render(_restart_reply()))
    out = console.export_text()
    for expected in (
        "restart dflash (r-3) by U0OPERATOR1: RUNNING 8/8 processes pid 4242",
        "✓ preflight 0.2 s",
        "✓ stop 3.1 s - 8 processes stopped",
        "- clear_cache",
        "✗ launch 0.1 s - exit 3",
        "patches: topk",
        "uptime",
        "1 h 2 m",
        "1,412",
        "last 2 lines of /w/train.log",
        "step 2 loss 1.9",
        "chart: /tmp/digest.png",
        "[Show log] (show_log)",
    ):
        assert expected in out, expected


def test_console_and_slack_render_the_same_reply() -> None:
    """The same handler output shows the same title, lines and step texts in the console and in Slack's blocks."""
    reply = _restart_reply()
    console = _console()
    console.print(render(reply))
    shown = console.export_text()
    slack = "\n".join(blocks.block_texts(blocks.reply_blocks(reply)))
    for text in (reply.title, *reply.lines, *(s.text() for s in reply.steps), "step 2 loss 1.9"):
        assert text in shown, text
        assert blocks.escape(text) in slack, text


async def test_console_outbox_prints_live_steps_by_thread_key() -> None:
    """The first announce prints the whole headline; later ones only the steps that changed; all prefixed [run r-3]."""
    console = _console()
    outbox = ConsoleOutbox(console)
    first = Reply(title="restart dflash (r-3)", steps=(StepLine("stop", "running"),))
    second = Reply(
        title="restart dflash (r-3)", steps=(StepLine("stop", "ok", 2.0), StepLine("launch", "running"))
    )
    await outbox.announce("run:r-3", first, None)
    await outbox.announce("run:r-3", second, None)
    await outbox.thread("run:r-3", Reply(title="verdict RUNNING 8/8 processes pid 4242"), None)
    await outbox.post(Reply(title="digest dflash: 1,412 tokens/s"), None)
    lines = [line.rstrip() for line in console.export_text().splitlines() if line.strip()]
    assert lines == [
        "[run r-3] restart dflash (r-3)",
        "… stop",
        "[run r-3] ✓ stop 2.0 s",
        "[run r-3] … launch",
        "[run r-3] ↳ verdict RUNNING 8/8 processes pid 4242",
        "digest dflash: 1,412 tokens/s",
    ]
    assert key_prefix("incident:dflash:7") == "[incident dflash:7]"


@dataclass
class Chat:
    """A real Context (Redis, SSH pool, restarter) with a ConsoleOutbox, and its dispatcher."""

    ctx: Context
    dispatcher: Dispatcher
    console: Console
    setup: JobSetup


@pytest.fixture
async def chat(
    redis_config: Config, ssh_server: InProcessHost, job_factory: JobFactory
) -> AsyncIterator[Chat]:
    """The console's parts on real Redis and the in-process SSH host; the job asks for confirmation."""
    setup = job_factory(ssh_server, confirm=True)
    config = slack_config(setup.config, redis_config, admins=("U0ADMIN",))
    console = _console()
    ctx = await build_context(config, ConsoleOutbox(console))
    dispatcher = Dispatcher(ctx)
    try:
        yield Chat(ctx, dispatcher, console, setup)
    finally:
        await dispatcher.drain(30)
        await close_context(ctx)
        kill_matching(setup.token)


async def test_console_and_slack_render_the_same_handler_output(chat: Chat) -> None:
    """Replies from the real handlers (help, status, a run's live message) show the same title, lines and
    step texts in the console and in Slack's blocks."""
    job = chat.setup.name
    replies = [
        await chat.dispatcher.handle(Request("help", "U0ADMIN", surface="console")),
        await chat.dispatcher.handle(Request(f"status {job}", "U0ADMIN", surface="console")),
    ]
    run = await chat.ctx.runs.create(job, "U0ADMIN")
    await chat.ctx.restarter.start(run)
    replies.append(run_reply(await chat.ctx.runs.get(run.id), chat.ctx.config))
    assert replies[-1].steps, "a started run has steps"
    for reply in replies:
        console = _console()
        console.print(render(reply))
        shown = " ".join(console.export_text().split())  # the console wraps long lines
        slack = "\n".join(blocks.block_texts(blocks.reply_blocks(reply)))
        for text in (reply.title, *reply.lines, *(s.text() for s in reply.steps)):
            assert " ".join(blocks.plain(text).split()) in shown, text
            assert blocks.escape(blocks.humanise_text(text), refs=True) in slack, text


async def test_confirmation_asks_and_confirms_or_cancels(chat: Chat, monkeypatch: pytest.MonkeyPatch) -> None:
    """A reply with a confirm button asks `confirm? [y/N]`; y starts the run, anything else cancels it."""
    answers = iter(["y", "n"])
    asked: list[str] = []

    async def ask(prompt: str) -> str | None:
        asked.append(prompt)
        return next(answers)

    session = ConsoleSession(chat.dispatcher, who=CliIdentity("U0ADMIN", "tester"), console=chat.console)
    monkeypatch.setattr(session, "ask", ask)
    job = chat.setup.name
    yes = await session.run_line(f"start {job}")
    await chat.dispatcher.drain(30)
    no = await session.run_line(f"stop {job}")
    assert asked == [CONSOLE_CONFIRM] * 2
    assert yes.title.startswith("queued run r-1") and yes.run_id == "r-1"
    assert no.exit_code == 5 and no.run_id is None
    assert len(await chat.ctx.runs.recent(job)) == 1


async def test_repl_runs_from_lines_without_a_terminal(chat: Chat) -> None:
    """The REPL reads lines from an iterable, takes the confirmation answer from the next line, and stops at quit;
    the run's live steps arrive under its key."""
    session = ConsoleSession(chat.dispatcher, who=CliIdentity("U0ADMIN", "tester"), console=chat.console)
    job = chat.setup.name
    code = await session.repl(["help", "", "# a comment", f"start {job}", "y", "quit", "help"])
    await chat.dispatcher.drain(30)
    assert code == 0
    out = chat.console.export_text()
    assert f"pitstop> start {job}" in out and f"{CONSOLE_CONFIRM}y" in out
    assert out.count(HELP_TITLE) == 1  # nothing after quit ran
    assert "queued run r-1" in out
    assert "[run r-1] ✓ launch" in out
    assert CONSOLE_BYE in out.splitlines()


async def test_run_console_end_to_end(
    redis_config: Config, ssh_server: InProcessHost, job_factory: JobFactory
) -> None:
    """`pitstop console` over given lines: builds everything, answers, prints the run's posts, exits 0 and closes."""
    setup = job_factory(ssh_server)
    config = slack_config(setup.config, redis_config, admins=("U0ADMIN",))
    console = _console()
    try:
        code = await run_console(
            config,
            who=CliIdentity("U0ADMIN", "tester"),
            lines=[f"start {setup.name}", f"status {setup.name}"],
            console=console,
        )
    finally:
        kill_matching(setup.token)
    assert code == 0
    out = console.export_text()
    assert "queued run r-1" in out and "[run r-1] ✓ launch" in out
    assert CONSOLE_BYE in out.splitlines()


async def test_console_at_end_of_input_waits_for_its_runs_verdict_before_bye(
    redis_config: Config, ssh_server: InProcessHost, job_factory: JobFactory
) -> None:
    """A console whose input ends between a launch and its verdict says it waits, prints the verdict, then
    `bye`: the run has its verdict when the console has exited."""
    setup = job_factory(ssh_server, start_window=2.0)
    config = slack_config(setup.config, redis_config, admins=("U0ADMIN",))
    console = _console()
    try:
        code = await run_console(
            config, who=CliIdentity("U0ADMIN", "tester"), lines=[f"start {setup.name}"], console=console
        )
        ctx = await build_context(config, ConsoleOutbox(_console()))
        try:
            run = await ctx.runs.get("r-1")
        finally:
            await close_context(ctx)
    finally:
        kill_matching(setup.token)
    assert code == 0
    assert run.verdict_line is not None and run.verdict_line.startswith("RUNNING"), run
    lines = console.export_text().splitlines()
    waiting = next(i for i, line in enumerate(lines) if line.startswith(console_awaiting("r-1", 0)[:30]))
    shown = next(i for i, line in enumerate(lines) if run.verdict_line in line)
    assert waiting < shown < lines.index(CONSOLE_BYE), lines


async def test_console_says_when_its_user_is_in_no_role(
    redis_config: Config, ssh_server: InProcessHost, job_factory: JobFactory
) -> None:
    """A console whose user is in no role of [auth] says so, naming the fix, before its first answer; a listed
    user hears nothing of it."""
    setup = job_factory(ssh_server)
    config = slack_config(setup.config, redis_config, operators=(), admins=("U0ADMIN",))
    config = config.model_copy(update={"auth": AuthSettings(admins=["U0ADMIN"])})
    outsider, admin = _console(), _console()
    assert (
        await run_console(config, who=CliIdentity("console", "tester"), lines=["help"], console=outsider) == 0
    )
    assert await run_console(config, who=CliIdentity("U0ADMIN", "tester"), lines=["help"], console=admin) == 0
    said = outsider.export_text()
    assert said.splitlines()[0].startswith(console_no_role("console")[:40])
    assert "add 'console' to [auth] operators" in " ".join(said.split())
    assert "is in no role" not in admin.export_text()


async def test_follow_prints_a_runs_steps_as_they_come_then_its_verdict(chat: Chat) -> None:
    """`follow r-N` in the console prints the run's step changes under its key, then its verdict in its thread."""
    session = ConsoleSession(chat.dispatcher, who=CliIdentity("U0ADMIN", "tester"), console=chat.console)
    run = await chat.ctx.runs.create(chat.setup.name, "U0ADMIN", action="start")
    following = asyncio.get_running_loop().create_task(session.run_line(f"follow {run.id}"))
    run = await chat.ctx.restarter.verify(await chat.ctx.restarter.start(run))
    assert (await asyncio.wait_for(following, 60)).exit_code == 0
    out = chat.console.export_text()
    assert f"{run.id}: start of {chat.setup.name}" in out and out.count("✓ launch") == 1
    assert f"[run {run.id}] ↳ {run.verdict_line}" in out
