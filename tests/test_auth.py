"""Authorisation: roles from [auth] by user id, user group or "*", nested, replaced per job; a denial is
a clear ephemeral reply with exit code 3, audited, and nothing runs."""

from __future__ import annotations

import uuid

import pytest

from handlers.context import Context
from handlers.grammar.commands import parse
from handlers.grammar.parse import Role
from handlers.request.auth import SYSTEM_USER, Denied, authorise, role_of
from handlers.request.dispatch import Dispatcher, Request
from handlers.text import denied
from pipeline.config import parse_config
from pipeline.state.audit import AuditOutcome
from pipeline.state.redisconn import RedisHandle
from tests.support_handlers import (
    ADMIN,
    NOBODY_GROUP,
    OPERATOR,
    OPS_GROUP,
    VIEWER,
    StandInRestarter,
    handler_config,
    make_context,
)

CONFIG = handler_config()


@pytest.mark.parametrize(
    ("user", "groups", "job", "role"),
    [
        (ADMIN, (), None, Role.ADMIN),
        (OPERATOR, (), None, Role.OPERATOR),
        ("U0SOMEONE01", (OPS_GROUP,), None, Role.OPERATOR),
        ("U0SOMEONE01", (NOBODY_GROUP,), None, Role.VIEWER),
        (VIEWER, (), None, Role.VIEWER),
        ("console", (), None, Role.VIEWER),
        # [jobs.solo.auth] operators = ["U0SOLO00001"] replaces the global operators for solo only
        (OPERATOR, (), "solo", Role.VIEWER),
        ("U0SOMEONE01", (OPS_GROUP,), "solo", Role.VIEWER),
        ("U0SOLO00001", (), "solo", Role.OPERATOR),
        ("U0SOLO00001", (), "dflash", Role.VIEWER),
        (ADMIN, (), "solo", Role.ADMIN),
    ],
)
def test_role_of(user: str, groups: tuple[str, ...], job: str | None, role: Role) -> None:
    """The highest role comes from the user id, any of their groups, or "*", per job when overridden."""
    assert role_of(CONFIG, user, groups, job) is role


def test_no_role_without_a_listing() -> None:
    """Without "*" a stranger — including the console user — holds no role at all."""
    config = parse_config({"auth": {"admins": ["U0ADMIN0001"], "viewers": ["S0TEAM00001"]}})
    assert role_of(config, "console") is None
    assert role_of(config, "U0STRANGER1") is None
    assert role_of(config, "U0STRANGER1", ("S0TEAM00001",)) is Role.VIEWER
    with pytest.raises(Denied) as info:
        authorise(config, parse("status", config), "console")
    assert info.value.message == denied("console", "status", None, "viewer")
    assert int(info.value.exit_code) == 3


@pytest.mark.parametrize(
    ("text", "user", "allowed"),
    [
        ("status", VIEWER, True),
        ("logs dflash", VIEWER, True),
        ("history", VIEWER, True),
        ("restart dflash", VIEWER, False),
        ("restart dflash", OPERATOR, True),
        ("watch dflash off", VIEWER, False),
        ("ack dflash", OPERATOR, True),
        ("unlock dflash", OPERATOR, False),
        ("unlock dflash", ADMIN, True),
        ("restart solo", OPERATOR, False),
        ("restart solo", "U0SOLO00001", True),
        ("restart dflash", "U0SOLO00001", False),
    ],
)
def test_each_verb_needs_its_role(text: str, user: str, allowed: bool) -> None:
    """Viewers read, operators act, admins unlock; admin ⊇ operator ⊇ viewer."""
    command = parse(text, CONFIG)
    if allowed:
        assert authorise(CONFIG, command, user) >= command.spec.role
    else:
        with pytest.raises(Denied):
            authorise(CONFIG, command, user)


def test_system_principal_only_from_the_scheduler() -> None:
    """Pitstop's own automatic restarts hold operator (never admin); the same id elsewhere holds only what
    the config gives it."""
    restart = parse("restart dflash", CONFIG)
    assert authorise(CONFIG, restart, SYSTEM_USER, system=True) is Role.OPERATOR
    with pytest.raises(Denied):
        authorise(CONFIG, parse("unlock dflash", CONFIG), SYSTEM_USER, system=True)
    config = parse_config({"auth": {"admins": ["U0ADMIN0001"]}, **_jobs()})
    with pytest.raises(Denied):
        authorise(config, parse("restart dflash", config), SYSTEM_USER)


def _jobs() -> dict[str, object]:
    job = {"host": "h", "workdir": "/w", "launch": ["x"], "log": "/w/l", "match": "x"}
    return {"hosts": {"h": {"address": "127.0.0.1"}}, "jobs": {"dflash": job}}


@pytest.fixture
def ctx(redis_handle: RedisHandle) -> Context:
    """A Context on real Redis with the stand-in restarter."""
    return make_context(CONFIG, redis_handle)


async def test_viewer_restart_is_denied_and_audited(ctx: Context) -> None:
    """A viewer's restart gets a clear ephemeral denial (exit 3), is audited, and runs nothing."""
    d = Dispatcher(ctx)
    reply = await d.handle(
        Request("restart dflash", user=VIEWER, delivery_id=uuid.uuid4().hex, channel="C0X")
    )
    assert reply.title == denied(VIEWER, "restart", "dflash", "operator")
    assert reply.exit_code == 3 and reply.ephemeral
    await d.drain(5)
    assert isinstance(ctx.restarter, StandInRestarter)
    assert await ctx.restarter.calls() == []
    assert await ctx.runs.recent() == []
    (entry,) = await d.audit.recent(count=5)
    assert (entry.outcome, entry.user, entry.verb, entry.job, entry.channel) == (
        AuditOutcome.DENIED,
        VIEWER,
        "restart",
        "dflash",
        "C0X",
    )
    assert entry.detail == reply.title


async def test_group_membership_grants_the_role(ctx: Context) -> None:
    """A user listed only through a user group (Request.groups) may act."""
    d = Dispatcher(ctx)
    reply = await d.handle(Request("restart dflash", user="U0MEMBER001", groups=(OPS_GROUP,)))
    assert reply.exit_code == 0
    await d.drain(30)


async def test_roles_are_rechecked_when_a_confirmation_is_clicked(redis_handle: RedisHandle) -> None:
    """A confirmation is settled under the config in force: a role lost meanwhile is denied on click."""
    ctx = make_context(CONFIG, redis_handle)
    d = Dispatcher(ctx)
    ask = await d.handle(Request("restart guarded", user=OPERATOR))
    token = ask.buttons[0].value
    demoted = CONFIG.model_copy(update={"auth": CONFIG.auth.model_copy(update={"operators": []})})
    d2 = Dispatcher(make_context(demoted, redis_handle))
    reply = await d2.handle_action("confirm", token, OPERATOR, "act:1")
    assert reply.exit_code == 3
    await d.drain(5)
    await d2.drain(5)


async def test_system_principal_acts_only_through_the_scheduler_surface(ctx: Context) -> None:
    """The watcher's automatic restart (SYSTEM_USER, surface "scheduler") is allowed; the same id typed
    on another surface (``pitstop say --as pitstop-auto``) is denied like any unlisted user."""
    d = Dispatcher(ctx)
    auto = await d.handle(Request("restart solo", user=SYSTEM_USER, surface="scheduler"))
    assert auto.exit_code == 0, auto.title
    forged = await d.handle(Request("restart dflash", user=SYSTEM_USER, surface="say"))
    assert forged.exit_code == 3
    await d.drain(30)
