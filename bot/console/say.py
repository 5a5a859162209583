"""``pitstop parse TEXT`` (the command as JSON, exit 0, or the error, exit 2) and ``pitstop say
TEXT``: one request through the dispatcher as Slack sends it, with its thread posts and, with
``--wait``, its verified verdict (``--json``: the reply model, those as follow-ups); ``follow r-N``
prints the run's steps as they happen, then its verdict.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import io
import json
import os
import sys
import threading
import uuid
from collections.abc import Callable
from typing import IO, TYPE_CHECKING, cast

from bot.console.words import TerminalNames
from bot.text import CONSOLE_CONFIRM, demo_wait_timed_out
from handlers.grammar.commands import ParseError, parse
from handlers.outbox import MemoryOutbox
from handlers.reply import Reply, StepLine, render_text
from handlers.runs.view import thread_key, verdict_reply
from pipeline.config import Config
from pipeline.errors import ExitCode, PitstopError

if TYPE_CHECKING:  # the request path (SSH, Redis) is imported only by ``say``, keeping ``parse`` quick
    from bot.console.identity import CliIdentity
    from handlers.context import Context

SEQUENCE_SLACK = 300.0  #: seconds allowed for a sequence beyond the job's stop timeout


def parse_main(config: Config, text: str, *, out: IO[str] | None = None, err: IO[str] | None = None) -> int:
    """``pitstop parse TEXT``: print the parsed command as JSON to ``out`` (exit 0) or the error to
    ``err`` (exit 2); default stdout and stderr."""
    try:
        command = parse(text, config)
    except ParseError as exc:
        print(exc.message, file=err or sys.stderr)
        return int(exc.exit_code)
    print(command.dumps((", ", ": ")), file=out or sys.stdout)
    return 0


class Output(io.TextIOBase):
    """A text stream whose reader may leave (``pitstop say … | head -1``): after the first
    :class:`BrokenPipeError` (or a closed stream) what is written is dropped, never raised, so the
    request and its run go on to their verdict; the stream's descriptor is pointed at
    ``/dev/null`` so the interpreter's last flush stays quiet too.  Anything else (``isatty``,
    ``encoding``, ``fileno``) is the wrapped stream's.

    :param stream: the stream written to (stdout).
    """

    def __init__(self, stream: IO[str]) -> None:
        super().__init__()
        self.stream = stream
        self.gone = False  #: True once the reader left

    @classmethod
    def over(cls, stream: IO[str]) -> IO[str]:
        """``stream`` wrapped, typed as the stream it stands for."""
        return cast("IO[str]", cls(stream))

    def write(self, text: str) -> int:
        """Write ``text`` unless the reader left; :returns: its length either way."""
        self._guard(lambda: self.stream.write(text))
        return len(text)

    def flush(self) -> None:
        """Flush unless the reader left."""
        self._guard(self.stream.flush)

    def isatty(self) -> bool:
        """Whether the wrapped stream is a terminal (False once its reader left)."""
        return not self.gone and self.stream.isatty()

    def fileno(self) -> int:
        """The wrapped stream's descriptor."""
        return self.stream.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        """The wrapped stream's encoding."""
        return getattr(self.stream, "encoding", None) or "utf-8"

    def _guard(self, op: Callable[[], object]) -> None:
        if self.gone:
            return
        try:
            op()
        except (BrokenPipeError, ValueError):  # ValueError: the stream was closed
            self.gone = True
            with contextlib.suppress(OSError, ValueError, io.UnsupportedOperation, AttributeError):
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, self.stream.fileno())
                os.close(devnull)


def stdin_line(prompt: str | None = None) -> asyncio.Future[str | None]:
    """One line of stdin, without its newline, read in a daemon thread (Ctrl-C and exit never wait
    for it): with ``input(prompt)`` on a terminal when ``prompt`` is given, else ``readline``.

    :returns: a future of the line; None at the end of input or if stdin cannot be read.
    """
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[str | None] = loop.create_future()

    def read() -> None:
        line: str | None
        try:
            if prompt is not None and sys.stdin.isatty():
                line = input(prompt)
            else:
                raw = sys.stdin.readline()
                line = raw.rstrip("\n") if raw else None
        except (EOFError, OSError, ValueError):
            line = None
        with contextlib.suppress(RuntimeError):  # loop closed
            loop.call_soon_threadsafe(lambda: None if fut.done() else fut.set_result(line))

    threading.Thread(target=read, name="pitstop-stdin", daemon=True).start()
    return fut


async def _follow(
    ctx: Context,
    run_id: str,
    seen: set[StepLine] | None,
    out: IO[str] | None,
    err: IO[str],
    names: TerminalNames,
) -> tuple[ExitCode, Reply | None]:
    """Follow run ``run_id`` to its end (:func:`~handlers.views.read.follow_run`: its verdict is
    delivered here when due, unless another process has it), printing to ``out`` (None: nothing)
    each step change not in ``seen`` (None: none), then the verdict, in ``names``' words.

    :returns: the exit code (the verdict's; 0 for a stop; 5 when the run did not end in time) and
        the verdict's reply, if any.
    """
    from handlers.views.read import ended, follow_run, fresh, within  # lazy: the request path

    async for run in follow_run(ctx, run_id):
        for step in fresh(run, seen) if seen is not None else ():
            print(names.text(step.text()), file=out, flush=True)
    if not ended(run):
        print(demo_wait_timed_out("verdict", run.job, within(ctx.config, run.job)), file=err)
        return ExitCode.CANCELLED, None
    if run.verdict is None:
        return ExitCode.OK, None
    verdict = verdict_reply(run)
    if out is not None:
        print(render_text(await names.reply(verdict)), file=out, flush=True)
    return verdict.exit_code, verdict


async def say_main(
    config: Config,
    text: str,
    *,
    who: CliIdentity,
    wait: bool,
    as_json: bool,
    out: IO[str] | None = None,
    err: IO[str] | None = None,
    names: TerminalNames | None = None,
) -> int:
    """``pitstop say TEXT``: one request through the Slack path; print the reply (and verdict) in
    words for a terminal (``@name``, ``#name``; never Slack's markup).

    :param who: who the request acts as (:func:`bot.console.identity.cli_identity`).
    :param wait: also wait for the verified verdict of a restart/start and print it.
    :param as_json: print :meth:`Reply.to_dict` instead of text (the reply model, as it is).
    :param names: where people's and channels' names come from (default: none, ids shown).
    """
    from bot.runtime.assembly import build_context, close_context  # lazy: the request path (SSH, Redis)
    from handlers.request.dispatch import Dispatcher  # lazy: as above
    from handlers.views.read import followed  # lazy: as above

    out, err = Output.over(out or sys.stdout), Output.over(err or sys.stderr)  # `| head` ends no run
    names = names or TerminalNames()

    async def shown(reply: Reply) -> str:
        return render_text(await names.reply(reply))

    outbox = MemoryOutbox()
    ctx = await build_context(config, outbox, deliver_recovered=True)
    dispatcher = Dispatcher(ctx)
    for taken in outbox.of("thread"):  # runs of a dead Pitstop process this call took over
        print(await shown(taken.reply), file=err, flush=True)
    outbox.posted.clear()
    try:
        request = who.request(text, f"say:{uuid.uuid4().hex}", "say")
        reply = await dispatcher.handle(request)
        confirm = next((b for b in reply.buttons if b.action == "confirm"), None)
        if confirm is not None:
            if not as_json:
                print(await shown(reply), file=out, flush=True)
            print(CONSOLE_CONFIRM, end="", file=err, flush=True)
            try:  # a silent stdin never blocks the answer
                answer = await asyncio.wait_for(stdin_line(), dispatcher.confirm_window)
            except TimeoutError:
                print("", file=err)
                answer = None
            action = "confirm" if (answer or "").strip().lower() in ("y", "yes") else "cancel"
            reply = await dispatcher.handle_action(
                action, confirm.value, who.user, f"say:{uuid.uuid4().hex}", via=request
            )
        if not as_json:
            print(await shown(reply), file=out, flush=True)
            if reply.exit_code is ExitCode.OK and (run_id := followed(text, config)) is not None:
                return int((await _follow(ctx, run_id, set(reply.steps), out, err, names))[0])
        if reply.run_id is None or reply.exit_code is not ExitCode.OK or not dispatcher.in_flight:
            if as_json:
                print(json.dumps(reply.to_dict()), file=out)
            return int(reply.exit_code)
        run = await ctx.runs.get(reply.run_id)
        spec = config.jobs.get(run.job)
        await dispatcher.drain((spec.stop_timeout if spec else 0.0) + SEQUENCE_SLACK)
        run = await ctx.runs.get(reply.run_id)
        posts = tuple(p.reply for p in outbox.of("thread") if p.key == thread_key(run.id))
        if not as_json:
            for post in posts:
                print(await shown(post), file=out, flush=True)
        # the sequence ended; a verdict already recorded is a failure or a cancel
        code = ExitCode.OK if run.verdict is None else verdict_reply(run).exit_code
        verdict: Reply | None = None
        if wait and code is ExitCode.OK and run.verdict is None and run.launched:
            code, verdict = await _follow(ctx, run.id, None, None if as_json else out, err, names)
        if as_json:
            extra = posts + ((verdict,) if verdict is not None else ())
            print(
                json.dumps(dataclasses.replace(reply, follow_ups=reply.follow_ups + extra).to_dict()),
                file=out,
            )
        return int(code)
    except PitstopError as exc:
        print(names.text(exc.message), file=err)
        return int(exc.exit_code)
    finally:
        await dispatcher.drain(5.0)
        await close_context(ctx)
