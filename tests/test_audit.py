"""The audit trail: every request — accepted, denied, refused, invalid, failed, duplicate — is one record
in a capped Redis stream, read back newest first."""

from __future__ import annotations

import json
import uuid

import pytest

import pipeline.state.audit as audit_mod
from handlers.context import Context
from handlers.request.dispatch import Dispatcher, Request
from pipeline.state import keys
from pipeline.state.audit import Audit, AuditEntry, AuditOutcome
from pipeline.state.redisconn import RedisHandle
from tests.support_handlers import ADMIN, OPERATOR, VIEWER, handler_config, make_context

CONFIG = handler_config()


@pytest.fixture
def ctx(redis_handle: RedisHandle) -> Context:
    """A Context on real Redis with the stand-in restarter."""
    return make_context(CONFIG, redis_handle)


async def test_every_outcome_is_recorded(ctx: Context) -> None:
    """Accepted, refused, denied, invalid and duplicate requests each leave one record with who, the
    text, the parsed command as JSON, the outcome and the run id."""
    d = Dispatcher(ctx, lock_ttl=5)
    accepted = await d.handle(
        Request("restart dflash with topk patch", OPERATOR, delivery_id="d1", channel="C1")
    )
    await d.handle(Request("restart dflash", ADMIN, delivery_id="d2"))  # refused: in flight
    await d.handle(Request("restart dflash", VIEWER, delivery_id="d3"))  # denied
    await d.handle(Request("restart dflsh", OPERATOR, delivery_id="d4"))  # invalid
    await d.handle(Request("restart dflash with topk patch", OPERATOR, delivery_id="d1"))  # duplicate
    await d.drain(30)
    entries = await d.audit.recent(count=10)
    assert [e.outcome for e in entries] == [
        AuditOutcome.DUPLICATE,
        AuditOutcome.INVALID,
        AuditOutcome.DENIED,
        AuditOutcome.REFUSED,
        AuditOutcome.ACCEPTED,
    ]
    first = entries[-1]
    assert (first.user, first.text, first.channel, first.run_id) == (
        OPERATOR,
        "restart dflash with topk patch",
        "C1",
        accepted.run_id,
    )
    assert json.loads(first.command) == {
        "verb": "restart",
        "job": "dflash",
        "host": None,
        "patches": ["topk"],
        "options": {"without": [], "fresh_cache": False},
    }
    assert entries[1].command == "" and entries[1].detail.startswith("unknown job 'dflsh'")
    assert entries[3].detail.startswith("restart of dflash already in flight - started by <@U0OPERATOR1>")
    assert all(e.ts > 0 for e in entries)


async def test_recent_filters_by_job_and_outcome_across_pages(redis_handle: RedisHandle) -> None:
    """``recent`` reads newest first, past the first page, filtering by job (any case) and outcome."""
    audit = Audit(redis_handle.client, redis_handle.prefix)
    for i in range(450):
        await audit.record(
            AuditEntry(
                user=f"U{i}",
                text=f"t{i}",
                outcome=AuditOutcome.DENIED if i % 50 == 0 else AuditOutcome.ACCEPTED,
                job="dflash" if i % 2 == 0 else "eagle",
            )
        )
    denied = await audit.recent(job="DFLASH", outcomes={AuditOutcome.DENIED}, count=20)
    assert [e.text for e in denied] == [f"t{i}" for i in range(400, -1, -50)]
    newest = await audit.recent(count=3)
    assert [e.text for e in newest] == ["t449", "t448", "t447"]
    eagle = await audit.recent(job="eagle", count=300)
    assert len(eagle) == 225 and eagle[0].text == "t449" and eagle[-1].text == "t1"


async def test_stream_is_capped(redis_handle: RedisHandle, monkeypatch: pytest.MonkeyPatch) -> None:
    """The stream is trimmed (XADD MAXLEN ~): it never grows far past its cap."""
    monkeypatch.setattr(audit_mod, "STREAM_MAXLEN", 100)
    audit = Audit(redis_handle.client, redis_handle.prefix)
    for i in range(1000):
        await audit.record(AuditEntry(user="U1", text=f"t{i}", outcome=AuditOutcome.ACCEPTED))
    length = await redis_handle.client.xlen(keys.audit(redis_handle.prefix))
    assert 100 <= length < 300
    assert (await audit.recent(count=1))[0].text == "t999"


async def test_confirmation_lifecycle_is_audited(ctx: Context) -> None:
    """A confirmation is audited when asked (pending), when someone else clicks (denied) and when the
    requester confirms (confirmed, with the run id)."""
    d = Dispatcher(ctx)
    ask = await d.handle(Request("restart guarded", OPERATOR, delivery_id=uuid.uuid4().hex))
    token = ask.buttons[0].value
    await d.handle_action("confirm", token, ADMIN, "a1")
    done = await d.handle_action("confirm", token, OPERATOR, "a2")
    await d.drain(30)
    entries = await d.audit.recent(count=5)
    assert [e.outcome for e in entries] == [AuditOutcome.CONFIRMED, AuditOutcome.DENIED, AuditOutcome.PENDING]
    assert entries[0].run_id == done.run_id and entries[0].user == OPERATOR
    assert entries[1].user == ADMIN
