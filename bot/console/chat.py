"""``pitstop console``: chat with Pitstop in a terminal, over the same handlers as Slack.
:class:`ConsoleSession` sends lines (typed, or from an iterable: the demo) to the dispatcher and
prints replies with :func:`render`; the team's posts come through :class:`ConsoleOutbox`.
"""

from __future__ import annotations

import contextlib
import sys
import uuid
from collections.abc import Iterable, Iterator, Mapping
from typing import IO

from rich.console import Console, Group, RenderableType
from rich.rule import Rule
from rich.table import Table as RichTable
from rich.text import Text

from bot.console.identity import CliIdentity
from bot.console.say import Output, stdin_line
from bot.console.words import TerminalNames
from bot.runtime.assembly import build_context, close_context
from bot.runtime.scheduler import PitstopScheduler
from bot.slack.blocks import plain, terminal
from bot.text import (
    CONSOLE_BYE,
    CONSOLE_CONFIRM,
    CONSOLE_PROMPT,
    console_awaiting,
    console_button,
    console_no_role,
    slack_earlier_omitted,
)
from handlers.reply import Reply, Status, StepLine
from handlers.request.auth import role_of
from handlers.request.dispatch import Dispatcher
from handlers.runs.view import thread_key, verdict_reply
from handlers.views.read import ended, follow_run, followed, fresh, within
from pipeline.config import Config
from pipeline.errors import ExitCode

STATUS_STYLE = {
    Status.OK: "bold green",
    Status.INFO: "bold cyan",
    Status.WARNING: "bold yellow",
    Status.ERROR: "bold red",
}
STEP_STYLE = {"ok": "green", "failed": "red", "skipped": "dim", "running": "yellow", "waiting": "yellow"}
PREFIX_STYLE = "bold magenta"
MAX_LOG_LINES = 200  #: lines of a log shown in the console (the end of it)
DRAIN_TIMEOUT = 120.0  #: seconds ``run_console`` waits for restarts in flight when the chat ends
_QUIT = frozenset({"quit", "exit", ":q", "bye"})


def make_console(*, file: IO[str] | None = None, record: bool = False, width: int | None = None) -> Console:
    """The rich Console the console chat prints to (``file``: default stdout, whose reader may leave
    without ending the chat's runs; ``record``: keep what was printed; ``width``: default the
    terminal's, 120 for a given file or piped output)."""
    console = Console(
        file=file or Output.over(sys.stdout),
        record=record,
        width=width or (120 if file else None),
        highlight=False,
    )
    if file is None and not console.is_terminal:
        console.soft_wrap = True  # piped output: whole lines, no hard wraps
        if width is None:
            console.width = 120  # a log or a pipe has no width of its own: as wide as a given file's
    return console


def key_prefix(key: str | None) -> str:
    """``run:r-3`` → ``[run r-3]`` (the thread key a console line belongs to)."""
    if not key:
        return ""
    head, _, rest = key.partition(":")
    return f"[{head} {rest}]" if rest else f"[{head}]"


def prefixed(prefix: str, text: Text) -> Text:
    """``text`` behind a thread-key prefix (``[run r-3] ✓ stop 2.1 s``); ``text`` if no prefix."""
    return Text.assemble((prefix, PREFIX_STYLE), " ", text) if prefix else text


def render_title(reply: Reply) -> Text:
    """The title (in terminal words already: :func:`render` made them) in its status colour."""
    return Text(reply.title, style=STATUS_STYLE[reply.status])


def render_step(step: StepLine, names: Mapping[str, str] | None = None) -> Text:
    """``✓ stop 2.1 s - 8 processes stopped``, coloured by outcome, in terminal words (``names``:
    id → name, else ids)."""
    return Text(plain(step.text(), names), style=STEP_STYLE.get(step.outcome, ""))


def render_log(reply: Reply) -> Group:
    """The log's last :data:`MAX_LOG_LINES` lines between rules (not a box: piped output would
    crop long lines), the first titled ``log_title``."""
    lines = (reply.log or "").rstrip("\n").splitlines()
    body = "\n".join(lines[-MAX_LOG_LINES:])
    if len(lines) > MAX_LOG_LINES:
        omitted = sum(len(line) + 1 for line in lines[:-MAX_LOG_LINES])
        body = slack_earlier_omitted(omitted) + "\n" + body
    title = Text(reply.log_title) if reply.log_title else ""
    return Group(Rule(title, align="left", style="dim"), Text(body), Rule(style="dim"))


def render(reply: Reply, prefix: str = "", names: Mapping[str, str] | None = None) -> RenderableType:
    """Everything in ``reply`` as rich renderables (the console counterpart of :mod:`bot.slack.blocks`),
    ``prefix`` (the thread key, ``[run r-3]``) before the title; in words for a terminal
    (:func:`~bot.slack.blocks.terminal`: ``names``, id → name, else ids; never Slack's markup)."""
    return _render(terminal(reply, names), prefix)


def _render(reply: Reply, prefix: str = "") -> RenderableType:
    parts: list[RenderableType] = [prefixed(prefix, render_title(reply))]
    parts += [render_step(s) for s in reply.steps]
    parts += [Text(line) for line in reply.lines]
    if reply.fields:
        grid = RichTable.grid(padding=(0, 2))
        grid.add_column(style="bold")
        grid.add_column()
        for label, value in reply.fields:
            grid.add_row(Text(label), Text(value))
        parts.append(grid)
    for table in reply.tables:
        rich_table = RichTable(*table.headers, show_edge=False, header_style="bold")
        for row in table.rows:
            rich_table.add_row(*(Text(c) for c in row))
        parts.append(rich_table)
    if reply.log:
        parts.append(render_log(reply))
    if reply.chart:
        parts.append(Text(f"chart: {reply.chart}", style="dim"))
    # a patch under review: its path here, its hash in the title
    parts += [Text(f"attached: {a.title or a.filename} ({a.path})", style="dim") for a in reply.attachments]
    if reply.buttons:
        hints = "  ".join(console_button(b.label, b.action) for b in reply.buttons)
        parts.append(Text(hints, style="dim"))
    for follow in reply.follow_ups:
        parts += [Text(""), _render(follow)]
    return Group(*parts)


class ConsoleOutbox:
    """:class:`~handlers.outbox.Outbox` for the terminal: team-visible posts printed as they come, in
    terminal words (``names``: default ids); a later ``announce`` of a key prints only what changed
    (the live step list)."""

    def __init__(self, console: Console, names: TerminalNames | None = None) -> None:
        self.console = console
        self.names = names or TerminalNames()
        self._shown: dict[str, Reply] = {}

    async def announce(self, key: str, reply: Reply, channel: str | None) -> None:
        """Print a headline, or the steps and title that changed since the last one for ``key``."""
        prefix = key_prefix(key)
        reply = await self.names.reply(reply)
        before = self._shown.get(key)
        self._shown[key] = reply
        if before is None:
            self.console.print(_render(reply, prefix))
            return
        seen = {s.label: s for s in before.steps}
        changed: list[RenderableType] = [render_step(s) for s in reply.steps if seen.get(s.label) != s]
        if reply.title != before.title or reply.status != before.status:
            changed.append(render_title(reply))
        if reply.log and reply.log != before.log:
            changed.append(render_log(reply))
        for part in changed:  # a Text behind the prefix, anything else below it
            if prefix and not isinstance(part, Text):
                self.console.print(Text(prefix, style=PREFIX_STYLE))
            self.console.print(prefixed(prefix, part) if isinstance(part, Text) else part)

    async def thread(self, key: str, reply: Reply, channel: str | None) -> None:
        """Print a thread reply under its key."""
        self.console.print(_render(await self.names.reply(reply), key_prefix(key) + " ↳"))

    async def announce_in(self, key: str, reply: Reply, story: str, channel: str | None) -> None:
        """Print a grouped post's member headline under the grouped post's key."""
        self._shown[key] = reply = await self.names.reply(reply)
        self.console.print(_render(reply, key_prefix(key)))

    async def post(self, reply: Reply, channel: str | None) -> None:
        """Print a standalone post (a digest)."""
        self.console.print(_render(await self.names.reply(reply), key_prefix(reply.thread_key)))

    async def tell(self, user: str, reply: Reply, prompt: str | None = None) -> None:
        """Print a private message (the console has one reader)."""
        self.console.print(_render(await self.names.reply(reply)))


class ConsoleSession:
    """One person chatting with Pitstop in a terminal (or a script driving it).

    :param who: who the requests act as (:func:`bot.console.identity.cli_identity`).
    :param names: where people's and channels' names come from (default: ids shown).
    ``confirm? [y/N]`` is answered by the next input line in :meth:`repl`, the terminal otherwise,
    else "no".  The runs it starts get their verdict before it says ``bye`` (:meth:`settle`).
    """

    def __init__(
        self,
        dispatcher: Dispatcher,
        *,
        who: CliIdentity,
        console: Console | None = None,
        names: TerminalNames | None = None,
    ) -> None:
        self.dispatcher = dispatcher
        self.who = who
        self.console = console or make_console()
        self.names = names or TerminalNames()
        self._lines: Iterator[str] | None = None
        self._read_stdin = False  #: True once a line was read from stdin
        self.runs: list[str] = []  #: ids of the runs this session started, oldest first

    async def run_line(self, text: str) -> Reply:
        """Send one line, print the reply, settle a confirmation it asks for; return the final reply."""
        delivery = f"console:{uuid.uuid4().hex}"
        req = self.who.request(text, delivery, "console")
        reply = await self.dispatcher.handle(req)
        self._started(reply)
        self.console.print(await self.show(reply))
        if reply.exit_code is ExitCode.OK and (run_id := followed(text, self.dispatcher.ctx.config)):
            await self.follow(run_id, reply.steps)
        if (confirm := next((b for b in reply.buttons if b.action == "confirm"), None)) is None:
            return reply
        answer = await self.ask(CONSOLE_CONFIRM)  # confirm and cancel carry one token, confirm's value
        action = "confirm" if (answer or "").strip().lower() in ("y", "yes") else "cancel"
        outcome = await self.dispatcher.handle_action(
            action, confirm.value, self.who.user, f"console:{uuid.uuid4().hex}", via=req
        )
        self._started(outcome)
        self.console.print(await self.show(outcome))
        return outcome

    async def show(self, reply: Reply, prefix: str = "") -> RenderableType:
        """``reply`` rendered in terminal words, with the names it refers to."""
        return _render(await self.names.reply(reply), prefix)

    def _started(self, reply: Reply) -> None:
        if reply.run_id is not None and reply.exit_code is ExitCode.OK and reply.run_id not in self.runs:
            self.runs.append(reply.run_id)

    async def settle(self) -> None:
        """Before ``bye``: let the sequences in flight end, then wait for the verdict of each launched
        run this session started, at most its job's follow bound (:func:`~handlers.views.read.within`);
        this process verifies it when due unless another has it, and the verdict is printed as a post.
        Ctrl-C (cancel) instead hands the runs over: the next ``pitstop`` process verifies them."""
        ctx = self.dispatcher.ctx
        await self.dispatcher.drain(DRAIN_TIMEOUT)
        for run_id in self.runs:
            run = await ctx.runs.get(run_id)
            if ended(run) or not run.launched:
                continue
            self.console.print(Text(console_awaiting(run_id, within(ctx.config, run.job)), style="dim"))
            async for _ in follow_run(ctx, run_id):
                pass

    async def follow(self, run_id: str, shown: tuple[StepLine, ...]) -> None:
        """``follow r-N`` after its answer (which showed ``shown``): each step change of the run as a
        restart's is printed here, then its verdict."""
        prefix = key_prefix(thread_key(run_id))
        seen = set(shown)
        async for run in follow_run(self.dispatcher.ctx, run_id, deliver=False):
            for step in fresh(run, seen):
                self.console.print(prefixed(prefix, render_step(step, self.names.names)))
        if run.verdict is not None:
            self.console.print(await self.show(verdict_reply(run), prefix + " ↳"))

    async def ask(self, prompt: str) -> str | None:
        """An answer to ``prompt``: from the input lines, or the terminal; None if none."""
        if self._lines is not None:
            line = next(self._lines, None)
            self.console.print(Text(prompt + (line or ""), style="bold"))
            return line
        if self._read_stdin or sys.stdin.isatty():
            return await self._read(prompt)
        self.console.print(Text(prompt + "n", style="bold"))
        return None

    async def _read(self, prompt: str) -> str | None:
        """A line of stdin, read in a daemon thread (Ctrl-C and exit never wait for it)."""
        self._read_stdin = True
        line = await stdin_line(prompt)
        if line is not None and not sys.stdin.isatty():  # a terminal echoes the line itself
            self.console.print(Text(prompt + line, style="bold"))
        return line

    async def repl(self, lines: Iterable[str] | None = None) -> int:
        """Answer ``lines`` (None: stdin) until ``quit`` or end of input; return 0."""
        self._lines = iter(lines) if lines is not None else None
        while True:
            if self._lines is not None:
                line = next(self._lines, None)
                if line is not None and line.strip():
                    self.console.print(Text(CONSOLE_PROMPT + line.strip(), style="bold"))
            else:
                line = await self._read(CONSOLE_PROMPT)
            if line is None:
                break
            text = line.strip()
            if not text or text.startswith("#"):
                continue
            if text.lower() in _QUIT:
                break
            await self.run_line(text)
        await self.settle()
        self.console.print(Text(CONSOLE_BYE, style="dim"))
        return 0


async def run_console(
    config: Config,
    *,
    who: CliIdentity,
    lines: Iterable[str] | None = None,
    console: Console | None = None,
    names: TerminalNames | None = None,
) -> int:
    """``pitstop console``: build the Context with a :class:`ConsoleOutbox`, start the scheduler,
    chat (:meth:`ConsoleSession.repl`: it waits for its runs' verdicts), close everything; return 0.
    ``names``: where people's and channels' names come from (default: ids shown)."""
    console = console or make_console()
    names = names or TerminalNames()
    if all(role_of(config, who.user, job=job) is None for job in [None, *config.jobs]):  # each request denied
        console.print(Text(console_no_role(who.user), style="bold yellow"))
    ctx = await build_context(config, ConsoleOutbox(console, names))
    sched = PitstopScheduler(ctx)
    try:
        await sched.start()
        dispatcher = Dispatcher(ctx)
        return await ConsoleSession(dispatcher, who=who, console=console, names=names).repl(lines)
    finally:
        with contextlib.suppress(Exception):
            await sched.stop()
        await close_context(ctx)
