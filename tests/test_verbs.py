"""The verb table and the one list of steps typed commands and buttons both run."""

from __future__ import annotations

import importlib
import uuid
from collections.abc import AsyncIterator

import pytest

from handlers.context import Context
from handlers.grammar import parse as grammar
from handlers.reply import Reply
from handlers.request import verbs
from handlers.request.dispatch import Dispatcher, Flow, Next, Request
from handlers.request.verbs import VERBS
from pipeline.state.redisconn import RedisHandle
from tests.support_handlers import VIEWER, handler_config, make_context

CONFIG = handler_config()


@pytest.fixture
async def dispatcher(redis_handle: RedisHandle) -> AsyncIterator[Dispatcher]:
    """A Dispatcher on real Redis with the stand-in restarter, drained after the test."""
    ctx: Context = make_context(CONFIG, redis_handle)
    d = Dispatcher(ctx, lock_ttl=5.0, confirm_window=1.0)
    try:
        yield d
    finally:
        await d.drain(30)


def test_every_grammar_verb_has_one_handler_in_help_order() -> None:
    """The table pairs each grammar entry with its handler, in the grammar's (help) order."""
    assert list(VERBS) == [spec.name for spec in grammar.GRAMMAR]


def test_a_table_that_disagrees_with_the_grammar_refuses_to_load(monkeypatch: pytest.MonkeyPatch) -> None:
    """A grammar verb without a handler fails when the verb table loads."""
    saved = dict(vars(verbs))  # a reload would leave the dispatcher holding the old classes (Acted)
    monkeypatch.setattr(grammar, "VERBS", {**grammar.VERBS, "reboot": grammar.VERBS["help"]})
    try:
        with pytest.raises(ValueError, match="reboot"):
            importlib.reload(verbs)
    finally:
        monkeypatch.undo()
        vars(verbs).clear()
        vars(verbs).update(saved)


async def test_typed_commands_and_buttons_run_the_same_steps(dispatcher: Dispatcher) -> None:
    """A step added to the list runs for a typed command and for a button alike, before the handler."""
    seen: list[tuple[str, str | None]] = []

    async def spy(flow: Flow, call_next: Next) -> Reply:
        reply = await call_next()
        seen.append((flow.req.surface, flow.run.verb if flow.run else None))
        return reply

    steps = list(dispatcher.steps)
    dispatcher.steps = (*steps[:-1], spy, steps[-1])  # just before confirm: after authorise
    typed = await dispatcher.handle(Request("logs dflash", user=VIEWER, delivery_id=uuid.uuid4().hex))
    button = await dispatcher.handle_action("show_log", "dflash", VIEWER, uuid.uuid4().hex)
    assert typed.exit_code == 0 and button.exit_code == 0
    assert typed.log == button.log
    assert seen == [("slack", "logs"), ("action", "logs")]
