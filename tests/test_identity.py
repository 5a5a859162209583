"""Who acted, as each surface proves it: the records keep the actor, its surface and OS user;
approve, deny and break glass are done only as oneself, proven; the two-person rule compares real
actors; an approval re-authorises the requester with fresh groups, and fails closed when groups
cannot be read; ``[auth]`` and ``approvers`` name Slack ids, never everyone nor no one; Slack's
user-group listing never passes a failure off as fresh."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from bot.console.identity import CliIdentity, IdentityRefused, cli_identity
from bot.slack.api import web_client
from bot.slack.people import GROUPS_TTL, People
from handlers.context import Context
from handlers.outbox import MemoryOutbox
from handlers.request.dispatch import Dispatcher, Request
from handlers.text import approval_self
from pipeline.config import Config, parse_config
from pipeline.errors import ConfigError, ExitCode, GroupsUnknown
from pipeline.state.approvals import ApprovalState
from pipeline.state.audit import Actor, AuditOutcome
from pipeline.state.redisconn import RedisHandle
from tests.fixtures.slack import BOT_TOKEN, FakeSlack
from tests.support_handlers import ADMIN, OPERATOR, OPS_GROUP, VIEWER, GroupBook, handler_config, make_context
from tests.test_approval import SECOND, _config

MEMBER = "U0OPSMEMBER"  #: an operator through OPS_GROUP only


@pytest.fixture
def config(tmp_path: Path) -> Config:
    """dflash's patched restarts wait for an admin; [auth.cli] maps OS users ``ops`` and ``boss``."""
    base = _config(tmp_path)
    return base.model_copy(
        update={"auth": base.auth.model_copy(update={"cli": {"ops": OPERATOR, "boss": ADMIN, "two": SECOND}})}
    )


@pytest.fixture
def book() -> GroupBook:
    """Slack's user groups as the tests change them."""
    return GroupBook()


@pytest.fixture
def ctx(config: Config, redis_handle: RedisHandle, book: GroupBook) -> Context:
    """A Context on real Redis whose user groups are ``book``'s."""
    return make_context(config, redis_handle, directory=book)


@pytest.fixture
async def dispatcher(ctx: Context) -> AsyncIterator[Dispatcher]:
    """A Dispatcher drained after the test."""
    d = Dispatcher(ctx, lock_ttl=5.0)
    try:
        yield d
    finally:
        await d.drain(30)


def _say(who: CliIdentity, text: str) -> Request:
    return who.request(text, f"say:{uuid.uuid4().hex}", "say")


def _slack(text: str, user: str, groups: tuple[str, ...] = ()) -> Request:
    return Request(text, user, groups, uuid.uuid4().hex, "C0REQUEST01")


async def _ask(dispatcher: Dispatcher, req: Request) -> str:
    reply = await dispatcher.handle(req)
    assert reply.exit_code is ExitCode.AWAITING_APPROVAL, reply.title
    assert reply.thread_key is not None
    return reply.thread_key.removeprefix("run:")


# --- the CLI's identity ---------------------------------------------------------------------------


def test_cli_identity_follows_auth_cli(config: Config) -> None:
    """Without [auth.cli], --as acts unproven (default `console`); with it, the OS user's own id,
    --as for an admin only (recorded as the admin), an unmapped OS user refused with the fix."""
    bare = config.model_copy(update={"auth": config.auth.model_copy(update={"cli": {}})})
    assert cli_identity(bare, "root") == CliIdentity("console", "root")
    assert cli_identity(bare, "root", OPERATOR) == CliIdentity(OPERATOR, "root")
    assert cli_identity(config, "ops") == CliIdentity(OPERATOR, "ops", proven=True)
    assert cli_identity(config, "ops", OPERATOR) == CliIdentity(OPERATOR, "ops", proven=True)
    assert cli_identity(config, "boss", OPERATOR) == CliIdentity(OPERATOR, "boss", by=ADMIN, proven=True)
    with pytest.raises(IdentityRefused) as err:
        cli_identity(config, "ops", ADMIN)
    assert "only an admin may act as someone else" in err.value.message and err.value.exit_code == 3
    with pytest.raises(IdentityRefused) as err:
        cli_identity(config, "mallory")
    assert (
        "'mallory' is not in [auth.cli]" in err.value.message and 'mallory = "U0123ABCD"' in err.value.message
    )


async def test_unproven_cli_may_not_approve_deny_nor_break_glass(
    config: Config, dispatcher: Dispatcher
) -> None:
    """Without [auth.cli], --as still runs other verbs, but approve, deny and --break-glass are
    refused (exit 3) with the fix, and audited as denied."""
    bare = config.model_copy(update={"auth": config.auth.model_copy(update={"cli": {}})})
    rid = await _ask(dispatcher, _slack("restart dflash with topk patch", OPERATOR))
    forged = cli_identity(bare, "bob", SECOND)
    assert (await dispatcher.handle(_say(forged, "pending"))).exit_code is ExitCode.OK
    for text in (f"approve {rid}", f"deny {rid}", 'restart dflash --break-glass "fire"'):
        reply = await dispatcher.handle(_say(forged, text))
        assert reply.exit_code is ExitCode.DENIED and "[auth.cli]" in reply.title, reply.title
    assert (await dispatcher.two_person.approvals.find(rid)).state is ApprovalState.PENDING  # type: ignore[union-attr]
    denied = await dispatcher.audit.recent(outcomes={AuditOutcome.DENIED}, count=5)
    assert len(denied) == 3 and {(e.user, e.os_user, e.surface) for e in denied} == {(SECOND, "bob", "say")}


async def test_as_is_refused_for_approve_deny_and_break_glass(config: Config, dispatcher: Dispatcher) -> None:
    """With [auth.cli], an admin's --as runs ordinary verbs recorded "admin as user", but approve,
    deny and --break-glass only act as the OS user's own id."""
    rid = await _ask(dispatcher, _slack("restart dflash with topk patch", OPERATOR))
    boss_as_second = cli_identity(config, "boss", SECOND)
    for text in (f"approve {rid}", f"deny {rid}", 'restart dflash --break-glass "fire"'):
        reply = await dispatcher.handle(_say(boss_as_second, text))
        assert reply.exit_code is ExitCode.DENIED and "never --as" in reply.title, reply.title
    glass = await dispatcher.handle(_say(cli_identity(config, "boss"), 'restart eagle --break-glass "fire"'))
    assert glass.exit_code is ExitCode.OK and glass.run_id is not None
    await dispatcher.drain(30)
    run = await dispatcher.ctx.runs.get(glass.run_id)
    assert run.actor == Actor(user=ADMIN, surface="say", os_user="boss")


async def test_an_admin_as_the_requester_cannot_approve_it(config: Config, dispatcher: Dispatcher) -> None:
    """The two-person rule compares real actors: an admin who asked --as an operator cannot approve
    it as themselves, in the CLI or in Slack; a second person can, and history names both doors."""
    rid = await _ask(
        dispatcher, _say(cli_identity(config, "boss", OPERATOR), "restart dflash with topk patch")
    )
    request = await dispatcher.two_person.approvals.find(rid)
    assert request is not None and request.requester == OPERATOR and request.real_requester == ADMIN
    outbox = dispatcher.ctx.outbox
    assert isinstance(outbox, MemoryOutbox)

    def titles() -> list[str]:
        return [p.reply.title for p in outbox.of("announce") if p.key == f"run:{rid}"]

    assert titles()[0].endswith(f"by <@{ADMIN}> as <@{OPERATOR}> is waiting for approval")
    for req in (_say(cli_identity(config, "boss"), f"approve {rid}"), _slack(f"approve {rid}", ADMIN)):
        reply = await dispatcher.handle(req)
        assert reply.exit_code is ExitCode.DENIED and reply.title == approval_self(rid)
    done = await dispatcher.handle(_say(cli_identity(config, "two"), f"approve {rid}"))
    assert done.exit_code is ExitCode.OK and done.run_id == rid, done.title
    await dispatcher.drain(30)
    run = await dispatcher.ctx.runs.get(rid)
    assert run.actor == Actor(user=OPERATOR, surface="say", by=ADMIN, os_user="boss")
    assert run.approver == Actor(user=SECOND, surface="say", os_user="two")
    assert any(t.startswith(f"{rid}: restart of dflash by <@{ADMIN}> as <@{OPERATOR}>") for t in titles())
    history = await dispatcher.handle(_slack("history dflash", VIEWER))
    who = history.tables[0].rows[0][2]
    assert who == f"<@{ADMIN}> as <@{OPERATOR}> (cli: boss) + <@{SECOND}> (cli: two)"
    (decisions,) = [f for f in history.follow_ups if "two-person rule" in f.title]
    assert any(r[2] == f"<@{SECOND}> (cli: two)" and r[3] == "approved" for r in decisions.tables[0].rows)


async def test_approval_reauthorises_the_requester_with_fresh_groups(
    dispatcher: Dispatcher, book: GroupBook
) -> None:
    """A requester who left the operators' group since asking: the approval closes the request
    unrun, saying why; a requester still in it gets their run."""
    stays = await _ask(dispatcher, _slack("restart dflash with topk patch", MEMBER, (OPS_GROUP,)))
    done = await dispatcher.handle(_slack(f"approve {stays}", ADMIN))
    assert done.exit_code is ExitCode.OK and done.run_id == stays, done.title
    await dispatcher.drain(30)
    leaves = await _ask(dispatcher, _slack("restart dflash with topk patch", MEMBER, (OPS_GROUP,)))
    book.groups[OPS_GROUP].remove(MEMBER)
    reply = await dispatcher.handle(_slack(f"approve {leaves}", ADMIN))
    assert reply.exit_code is ExitCode.DENIED
    assert reply.title.startswith(
        f"{leaves}: closed without running - its requester <@{MEMBER}> may no longer"
    )
    request = await dispatcher.two_person.approvals.find(leaves)
    assert request is not None and request.state is ApprovalState.REFUSED and "operator" in request.reason
    with pytest.raises(Exception, match=leaves):
        await dispatcher.ctx.runs.get(leaves)
    outbox = dispatcher.ctx.outbox
    assert isinstance(outbox, MemoryOutbox)
    shown = [p.reply for p in outbox.of("announce") if p.key == f"run:{leaves}"]
    assert "closed without running" in shown[-1].title and shown[-1].buttons == ()


async def test_groups_that_cannot_be_read_refuse_the_decision(
    dispatcher: Dispatcher, book: GroupBook
) -> None:
    """While Slack's user groups cannot be read fresh, approving and denying are refused, saying so,
    and the request stays open; once they can, the approval runs."""
    rid = await _ask(dispatcher, _slack("restart dflash with topk patch", OPERATOR))
    book.down = True
    for text in (f"approve {rid}", f"deny {rid}"):
        reply = await dispatcher.handle(_slack(text, ADMIN))
        assert reply.exit_code is ExitCode.DENIED and "usergroups.list keeps failing" in reply.title
    assert (await dispatcher.two_person.approvals.find(rid)).state is ApprovalState.PENDING  # type: ignore[union-attr]
    book.down = False
    assert (await dispatcher.handle(_slack(f"approve {rid}", ADMIN))).exit_code is ExitCode.OK


async def test_a_surface_without_slack_cannot_decide_when_roles_name_groups(
    config: Config, redis_handle: RedisHandle
) -> None:
    """The console reads no user groups: with roles naming a group it refuses decisions (fails
    closed), with none it decides by ids alone."""
    grouped = make_context(config, redis_handle)
    grouped.directory = None
    d = Dispatcher(grouped, lock_ttl=5.0)
    try:
        rid = await _ask(d, _slack("restart dflash with topk patch", OPERATOR))
        reply = await d.handle(_say(cli_identity(config, "boss"), f"approve {rid}"))
        assert reply.exit_code is ExitCode.DENIED and "cannot read Slack user groups" in reply.title
    finally:
        await d.drain(30)


# --- the config ---------------------------------------------------------------------------------


def _with(
    auth: dict[str, Any], approvers: list[str], job_auth: dict[str, Any] | None = None
) -> dict[str, Any]:
    job: dict[str, Any] = {"host": "h", "workdir": "/w", "launch": ["x"], "log": "/w/l", "match": "x"}
    job["approval"] = {"actions": ["restart"], "approvers": approvers}
    if job_auth is not None:
        job["auth"] = job_auth
    return {"auth": auth, "hosts": {"h": {"address": "x"}}, "jobs": {"dflash": job}}


def test_config_refuses_approvers_who_are_everyone_or_no_one() -> None:
    """check-config refuses approvers that resolve to everyone ("*" through a role, the job's own
    roles included) or to no one; ids and roles that list people pass."""
    for data, wanted in (
        (_with({"admins": ["U0A1"], "viewers": ["*"]}, ["viewer"]), "'viewer' lets anyone approve"),
        (_with({"operators": ["*"]}, ["operator", "U0A1"]), "'operator' lets anyone approve"),
        (_with({"admins": ["*"]}, ["viewer"]), "'viewer' lets anyone approve"),
        (_with({"admins": ["U0A1"]}, ["admin"], {"admins": ["*"]}), "'admin' lets anyone approve"),
        (_with({"viewers": ["*"]}, ["admin"]), "no one can approve (admin list no one)"),
        (_with({"admins": ["U0A1"]}, ["admin"], {"admins": []}), "no one can approve"),
    ):
        with pytest.raises(ConfigError) as err:
            parse_config(data)
        assert f"jobs.dflash.approval.approvers: {wanted}" in str(err.value), str(err.value)
    assert parse_config(_with({"admins": ["U0A1"], "viewers": ["*"]}, ["admin"])).jobs["dflash"].approval
    assert parse_config(_with({"viewers": ["*"]}, ["S0ONCALL"])).jobs["dflash"].approval


def test_config_names_people_by_slack_id() -> None:
    """[auth], [jobs.NAME.auth] and approvers take Slack ids (or "*", or a role for approvers);
    a display name is refused, as are [auth.cli] entries that are not OS user → user id."""
    base = _with({"admins": ["U0A1"]}, ["admin"])
    for auth, job_auth, approvers, wanted in (
        ({"admins": ["maya"]}, None, ["admin"], "auth.admins: 'maya' is not a Slack id"),
        ({"admins": ["U0A1"]}, {"operators": ["@lee"]}, ["admin"], "jobs.dflash.auth.operators: '@lee'"),
        ({"admins": ["U0A1"]}, None, ["lee"], "approver 'lee' is not a role"),
        ({"admins": ["U0A1"], "cli": {"maya": "maya"}}, None, ["admin"], "'maya' is not a Slack user id"),
        (
            {"admins": ["U0A1"], "cli": {"maya": "S0GROUP"}},
            None,
            ["admin"],
            "'S0GROUP' is not a Slack user id",
        ),
        ({"admins": ["U0A1"], "cli": {"a b": "U0A1"}}, None, ["admin"], "'a b' is not an OS user name"),
    ):
        with pytest.raises(ConfigError) as err:
            parse_config(_with(auth, approvers, job_auth))
        assert wanted in str(err.value), str(err.value)
    config = parse_config({**base, "auth": {"admins": ["U0A1", "W0B2", "S0C3"], "cli": {"maya": "U0A1"}}})
    assert config.auth.cli == {"maya": "U0A1"}
    assert handler_config().auth.viewers == ["*"]  # everyone stays allowed in [auth]'s roles


# --- Slack's user groups ---------------------------------------------------------------------------


async def test_a_failing_group_listing_fails_closed_after_its_ttl(fake_slack: FakeSlack) -> None:
    """A failed usergroups.list keeps the last listing and its time: requests still use it, but a
    fresh read for an approval fails closed once it is older than the TTL, and works again once
    Slack answers."""
    now = [1000.0]
    people = People(web_client(BOT_TOKEN, base_url=fake_slack.api_url), clock=lambda: now[0])
    try:
        assert await people.fresh_groups("U0OPERATOR1") == ("S0ONCALL",)
        now[0] += GROUPS_TTL / 2
        assert await people.fresh_groups("U0OPERATOR1") == ("S0ONCALL",)  # fresh enough: not listed again
        assert len(await fake_slack.calls("usergroups.list")) == 1
        now[0] += GROUPS_TTL
        fake_slack.fail_next("usergroups.list", error="internal_error")
        with pytest.raises(GroupsUnknown) as err:
            await people.fresh_groups("U0OPERATOR1")
        assert (
            err.value.age == pytest.approx(1.5 * GROUPS_TTL) and "last listed 90 s ago" in err.value.message
        )
        assert await people.groups_of("U0OPERATOR1") == ("S0ONCALL",)  # ordinary requests: the last listing
        assert await people.fresh_groups("U0OPERATOR1") == ("S0ONCALL",)  # Slack answers again
        assert len(await fake_slack.calls("usergroups.list")) == 3
    finally:
        await people.aclose()
