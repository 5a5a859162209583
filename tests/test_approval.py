"""The two-person rule through the dispatcher: a request waits and shows what would change, a second
person approves (the run carries the approved hashes) or denies, the requester never approves their
own, a non-approver is refused privately, the first decision wins across replicas, requests expire,
a patch edited after approval stops at pre-flight, and an admin's break glass is announced."""

from __future__ import annotations

import asyncio
import hashlib
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from handlers.context import Context
from handlers.outbox import MemoryOutbox
from handlers.request.dispatch import Dispatcher, Request
from handlers.text import (
    approval_denied,
    approval_not_request,
    approval_self,
    pending_none,
    pending_title,
    queued,
)
from pipeline.config import Config, parse_config
from pipeline.engines.runner import Runner
from pipeline.engines.workdir import diffstat
from pipeline.errors import ConfigError, ExitCode
from pipeline.state.approvals import Approvals, ApprovalState
from pipeline.state.audit import AuditOutcome
from pipeline.state.events import Events
from pipeline.state.redisconn import RedisHandle
from pipeline.state.runs import RunStore
from pipeline.verdict import Verdict
from tests.support_handlers import (
    ADMIN,
    OPERATOR,
    OPS_GROUP,
    VIEWER,
    StandInRestarter,
    handler_config,
    make_context,
    wait_until,
)

SECOND = "U0ADMIN0002"  #: a second admin: an approver who did not ask
TOPK = Path(__file__).resolve().parents[1] / "pipeline" / "dflash" / "patches" / "topk.diff"


def _config(tmp_path: Path, expires: float = 900, **approval: Any) -> Config:
    patch = tmp_path / "topk.diff"
    if not patch.exists():
        patch.write_bytes(TOPK.read_bytes())
    policy_table = {"actions": ["restart_with_patch", "stop"], "approvers": ["admin"], "expires": expires}
    policy_table.update(approval)
    config = handler_config(
        dflash={"patches": {"topk": str(patch)}, "approval": policy_table, "channel": "C0DFLASH001"}
    )
    auth = config.auth.model_copy(update={"admins": [ADMIN, SECOND]})
    return config.model_copy(update={"auth": auth})


@pytest.fixture
def config(tmp_path: Path) -> Config:
    """dflash under the two-person rule: patched restarts and stops wait for an admin."""
    return _config(tmp_path)


@pytest.fixture
def ctx(config: Config, redis_handle: RedisHandle) -> Context:
    """A Context on real Redis with the stand-in restarter."""
    return make_context(config, redis_handle)


@pytest.fixture
async def dispatcher(ctx: Context) -> AsyncIterator[Dispatcher]:
    """A Dispatcher drained after the test."""
    d = Dispatcher(ctx, lock_ttl=5.0)
    try:
        yield d
    finally:
        await d.drain(30)


def _req(text: str, user: str = OPERATOR, **kw: Any) -> Request:
    return Request(text=text, user=user, delivery_id=uuid.uuid4().hex, channel="C0REQUEST01", **kw)


def _outbox(ctx: Context) -> MemoryOutbox:
    assert isinstance(ctx.outbox, MemoryOutbox)
    return ctx.outbox


def _restarter(ctx: Context) -> StandInRestarter:
    assert isinstance(ctx.restarter, StandInRestarter)
    return ctx.restarter


async def _ask(
    dispatcher: Dispatcher, text: str = "restart dflash with topk patch", user: str = OPERATOR
) -> str:
    reply = await dispatcher.handle(_req(text, user))
    assert reply.exit_code is ExitCode.AWAITING_APPROVAL, reply.title
    assert reply.thread_key is not None
    return reply.thread_key.removeprefix("run:")


# --- config --------------------------------------------------------------------------------------


def test_approval_table_is_validated(tmp_path: Path) -> None:
    """check-config names each bad key of [jobs.NAME.approval]; a job without it has no policy."""
    config = _config(tmp_path)
    assert config.jobs["dflash"].approval is not None
    assert config.jobs["dflash"].approval.expires == 900 and config.jobs["eagle"].approval is None
    assert _config(tmp_path, expires="30m").jobs["dflash"].approval.expires == 1800  # type: ignore[union-attr]
    job = {"host": "h", "workdir": "/w", "launch": ["x"], "log": "/w/l", "match": "x"}
    for table, wanted in (
        ({"actions": ["reboot"], "approvers": ["admin"]}, "jobs.dflash.approval.actions[0]"),
        ({"actions": ["restart"], "approvers": []}, "jobs.dflash.approval.approvers"),
        ({"actions": ["restart"], "approvers": ["*"]}, "'*' would let anyone approve"),
        ({"actions": ["restart"], "approvers": ["admins"]}, "approver 'admins': the role is written 'admin'"),
        ({"actions": ["restart"], "approvers": ["admin"], "expires": "soon"}, "jobs.dflash.approval.expires"),
        ({"actions": ["restart"], "approvers": ["admin"], "who": 1}, "jobs.dflash.approval.who: unknown key"),
    ):
        data = {"hosts": {"h": {"address": "x"}}, "jobs": {"dflash": {**job, "approval": table}}}
        with pytest.raises(ConfigError) as err:
            parse_config(data)
        assert wanted in str(err.value), str(err.value)


async def test_a_job_without_the_table_acts_as_before(dispatcher: Dispatcher, ctx: Context) -> None:
    """A job with no [jobs.NAME.approval] restarts on one person's word."""
    reply = await dispatcher.handle(_req("restart eagle"))
    assert reply.title == queued("r-1", "eagle")
    await dispatcher.drain(30)
    assert len(await _restarter(ctx).calls()) == 1


# --- the request ------------------------------------------------------------------------------------


async def test_request_waits_and_shows_what_would_change(
    dispatcher: Dispatcher, ctx: Context, config: Config
) -> None:
    """A patched restart waits (exit 7): its message says so, with the diffstat, the SHA-256, the exact
    patch bytes attached, Approve/Deny and who may click; nothing runs; a restart without a patch runs."""
    rid = await _ask(dispatcher)
    raw = TOPK.read_bytes()
    sha = hashlib.sha256(raw).hexdigest()
    shown = _outbox(ctx).of("announce")[-1]
    assert shown.key == f"run:{rid}" and shown.channel == "C0DFLASH001"
    reply = shown.reply
    assert "waiting for approval" in reply.title
    assert [(b.action, b.value) for b in reply.buttons] == [("approve", rid), ("deny", rid)]
    assert any(sha[:12] in line for line in reply.lines)
    assert "    metrics.py | +2 -3" in reply.lines
    assert any("may approve: admins" in line for line in reply.lines)
    (attached,) = reply.attachments
    assert attached.content.encode() == raw and sha in attached.title
    assert await _restarter(ctx).calls() == []
    request = await dispatcher.two_person.approvals.find(rid)
    assert request.state is ApprovalState.PENDING and request.hashes == {"topk": sha}
    awaiting = await dispatcher.audit.recent(outcomes={AuditOutcome.AWAITING}, count=5)
    assert [e.run_id for e in awaiting] == [rid] and sha[:12] in awaiting[0].detail
    plain = await dispatcher.handle(_req("restart dflash"))  # not in actions: runs as today
    assert plain.exit_code is ExitCode.OK and plain.run_id != rid


def test_diffstat_counts_each_file() -> None:
    """diffstat gives one `path | +A -R` line per file, as git diff --stat counts them."""
    text = "--- a/x.py\n+++ b/x.py\n@@ -1 +1,2 @@\n-a\n+b\n+c\n--- a/y\n+++ b/y\n@@ -1 +0,0 @@\n-z\n"
    assert diffstat(text) == ("x.py | +2 -1", "y | +0 -1")
    # an added line that reads like another file's header is a line of its own file (git apply --stat)
    sly = "--- a/train.py\n+++ b/train.py\n@@ -1,2 +1,5 @@\n a = 1\n++++ b/README.md\n+x\n+--- a/y\n b = 2\n"
    assert diffstat(sly) == ("train.py | +3 -0",)


# --- the rules --------------------------------------------------------------------------------------


async def test_second_person_approves_and_the_run_carries_the_hash(
    dispatcher: Dispatcher, ctx: Context
) -> None:
    """An approver who did not ask approves: the restart runs once as r-N, on behalf of the requester,
    with the approver and the approved SHA-256 on the run and in the audit trail; the buttons go."""
    rid = await _ask(dispatcher)
    done = await dispatcher.handle(_req(f"approve {rid}", ADMIN))
    assert done.title == queued(rid, "dflash") and done.run_id == rid
    await dispatcher.drain(30)
    (call,) = await _restarter(ctx).calls()
    assert call["run"] == rid and call["add"] == ["topk"]
    run = await ctx.runs.get(rid)
    sha = hashlib.sha256(TOPK.read_bytes()).hexdigest()
    assert run.requested_by == OPERATOR and run.approved_by == ADMIN and run.approved_patches == {"topk": sha}
    live = [p.reply for p in _outbox(ctx).of("announce") if p.key == f"run:{rid}"][-1]
    assert ("approved by", f"<@{ADMIN}> (topk sha256 {sha[:12]})") in live.fields
    approved = await dispatcher.audit.recent(outcomes={AuditOutcome.APPROVED}, count=5)
    assert approved[0].user == ADMIN and sha[:12] in approved[0].detail and OPERATOR in approved[0].detail
    closed = [
        p for p in _outbox(ctx).of("announce") if p.key == f"run:{rid}" and "approved by" in p.reply.title
    ]
    assert closed and closed[-1].reply.buttons == ()
    again = await dispatcher.handle(_req(f"approve {rid}", SECOND))
    assert "already approved" in again.title and again.exit_code is ExitCode.FAILED


async def test_requester_never_approves_their_own(dispatcher: Dispatcher, ctx: Context) -> None:
    """An approver who asked cannot approve their own request, typed or clicked (exit 3); it stays open."""
    rid = await _ask(dispatcher, user=ADMIN)
    typed = await dispatcher.handle(_req(f"approve {rid}", ADMIN))
    clicked = await dispatcher.handle_action("approve", rid, ADMIN, "act:self")
    for reply in (typed, clicked):
        assert reply.title == approval_self(rid) and reply.exit_code is ExitCode.DENIED and reply.ephemeral
    assert (await dispatcher.two_person.approvals.find(rid)).state is ApprovalState.PENDING
    assert await _restarter(ctx).calls() == []
    assert (await dispatcher.handle(_req(f"approve {rid}", SECOND))).title == queued(rid, "dflash")


async def test_a_click_without_the_right_is_refused_privately(dispatcher: Dispatcher, ctx: Context) -> None:
    """A viewer's (or an operator's) Approve or Deny click is refused privately (exit 3); the request stays."""
    rid = await _ask(dispatcher)
    for user, action in ((VIEWER, "approve"), (VIEWER, "deny"), ("U0OPSMEMBER", "approve")):
        groups = (OPS_GROUP,) if user == "U0OPSMEMBER" else ()
        reply = await dispatcher.handle_action(action, rid, user, f"act:{user}:{action}", groups=groups)
        assert reply.ephemeral and reply.exit_code is ExitCode.DENIED and "may not decide" in reply.title
    assert (await dispatcher.two_person.approvals.find(rid)).state is ApprovalState.PENDING
    assert await _restarter(ctx).calls() == []
    denied = await dispatcher.audit.recent(outcomes={AuditOutcome.DENIED}, count=5)
    assert {e.user for e in denied} == {VIEWER, "U0OPSMEMBER"}


async def test_two_replicas_approving_at_once_run_it_once(config: Config, redis_handle: RedisHandle) -> None:
    """Two Approve clicks at the same moment on two replicas (two dispatchers, one Redis): one run."""
    one, two = make_context(config, redis_handle), make_context(config, redis_handle)
    a, b = Dispatcher(one, lock_ttl=5.0), Dispatcher(two, lock_ttl=5.0)
    try:
        rid = await _ask(a)
        first, second = await asyncio.gather(
            a.handle_action("approve", rid, ADMIN, "act:A"), b.handle_action("approve", rid, SECOND, "act:B")
        )
        titles = sorted([first.title, second.title])
        assert titles.count(queued(rid, "dflash")) == 1, titles
        assert sum("already approved" in t for t in titles) == 1
    finally:
        await a.drain(30)
        await b.drain(30)
    calls = await _restarter(one).calls()  # both stand-ins record in the same Redis list
    assert [c["run"] for c in calls] == [rid]


async def test_deny_with_a_reason_ends_it(dispatcher: Dispatcher, ctx: Context) -> None:
    """An approver's deny ends the request with their reason in its message and the audit trail."""
    rid = await _ask(dispatcher)
    reply = await dispatcher.handle(_req(f"deny {rid} not during the eval run", SECOND))
    assert reply.exit_code is ExitCode.OK
    request = await dispatcher.two_person.approvals.find(rid)
    assert request.state is ApprovalState.DENIED and request.reason == "not during the eval run"
    last = _outbox(ctx).of("announce")[-1].reply
    assert last.title == approval_denied(rid, SECOND, "not during the eval run") and last.buttons == ()
    rejected = await dispatcher.audit.recent(outcomes={AuditOutcome.REJECTED}, count=5)
    assert rejected[0].user == SECOND and "not during the eval run" in rejected[0].detail
    late = await dispatcher.handle(_req(f"approve {rid}", ADMIN))
    assert "already denied" in late.title
    assert await _restarter(ctx).calls() == []


async def test_a_request_expires_with_a_line_and_no_buttons(
    tmp_path: Path, redis_handle: RedisHandle
) -> None:
    """Nobody decides within `expires`: the request closes as expired, its message says so without
    buttons, and a late approval does nothing."""
    ctx = make_context(_config(tmp_path, expires=0.5), redis_handle)
    dispatcher = Dispatcher(ctx, lock_ttl=5.0)
    try:
        rid = await _ask(dispatcher)

        async def closed() -> bool:
            return (await dispatcher.two_person.approvals.find(rid)).state is ApprovalState.EXPIRED

        await wait_until(closed, timeout=10)
        last = [p for p in _outbox(ctx).of("announce") if p.key == f"run:{rid}"][-1].reply
        assert "expired after" in last.title and last.buttons == ()
        late = await dispatcher.handle(_req(f"approve {rid}", ADMIN))
        assert "already expired" in late.title
        assert await _restarter(ctx).calls() == []
        expired = await dispatcher.audit.recent(outcomes={AuditOutcome.EXPIRED}, count=5)
        assert [e.run_id for e in expired] == [rid]
    finally:
        await dispatcher.drain(30)


async def test_a_request_outlives_its_process(tmp_path: Path, redis_handle: RedisHandle) -> None:
    """The process that asked goes away: another replica approves it, or any replica's sweep expires it."""
    config = _config(tmp_path, expires=0.5)
    asker = Dispatcher(make_context(config, redis_handle), lock_ttl=5.0)
    rid = await _ask(asker)
    await asker.drain(0)  # the asking process ends: its expiry timer with it
    other = Dispatcher(make_context(config, redis_handle), lock_ttl=5.0)
    try:
        assert [r.id for r in await other.two_person.approvals.pending()] == [rid]

        async def due() -> bool:
            return bool(await other.two_person.approvals.due())

        await wait_until(due, timeout=10)
        assert await other.two_person.expire_due() == 1 and await other.two_person.expire_due() == 0
        assert (await other.two_person.approvals.find(rid)).state is ApprovalState.EXPIRED
        assert await RunStore(redis_handle.client, redis_handle.prefix).unowned() == []
    finally:
        await other.drain(30)


async def test_pending_lists_waiting_requests(dispatcher: Dispatcher) -> None:
    """`pending` lists each waiting request with its requester and patch hash."""
    rid = await _ask(dispatcher)
    sha = hashlib.sha256(TOPK.read_bytes()).hexdigest()
    reply = await dispatcher.handle(_req("pending", VIEWER))
    assert reply.title == pending_title(1)
    assert rid in reply.lines[0] and f"topk {sha[:12]}" in reply.lines[0]
    assert (await dispatcher.handle(_req("pending eagle", VIEWER))).title == pending_none("eagle")


async def test_patch_edited_after_approval_stops_at_preflight(
    config: Config, redis_handle: RedisHandle, tmp_path: Path
) -> None:
    """The patch file changes after it was shown: the approved run stops at pre-flight ("patch changed
    since approval") before any command reaches the host."""
    runs = RunStore(redis_handle.client, redis_handle.prefix)
    ctx = make_context(config, redis_handle)
    calls: list[object] = []

    class CountingSSH:
        async def run_job(self, *args: object, **kw: object) -> object:
            calls.append(args)
            raise AssertionError("nothing may reach the host")

        async def run(self, *args: object, **kw: object) -> object:
            calls.append(args)
            raise AssertionError("nothing may reach the host")

    runner = Runner(config, CountingSSH(), runs, Events(redis_handle.client, redis_handle.prefix))  # type: ignore[arg-type]
    ctx.restarter = runner
    dispatcher = Dispatcher(ctx, lock_ttl=5.0)
    try:
        rid = await _ask(dispatcher)
        patch = tmp_path / "topk.diff"
        patch.write_bytes(patch.read_bytes() + b"# edited after review\n")
        reply = await dispatcher.handle(_req(f"approve {rid}", ADMIN))
        assert reply.title == queued(rid, "dflash")
        await dispatcher.drain(30)
    finally:
        await dispatcher.drain(30)
    run = await runs.get(rid)
    assert run.verdict is Verdict.PREFLIGHT_FAILED
    assert run.verdict_line is not None and "patch changed since approval" in run.verdict_line
    assert [s.step.value for s in run.steps] == ["preflight"] and calls == []


# --- break glass ------------------------------------------------------------------------------------


async def test_break_glass_runs_announced_and_marked(dispatcher: Dispatcher, ctx: Context) -> None:
    """An admin's --break-glass runs at once, is announced in the channel with the reason and marked on
    the run and in the audit trail; an operator's is denied."""
    refused = await dispatcher.handle(_req('restart dflash with topk patch --break-glass "fire"', OPERATOR))
    assert refused.exit_code is ExitCode.DENIED
    reply = await dispatcher.handle(_req('restart dflash with topk patch --break-glass "NCCL hang"', ADMIN))
    assert reply.exit_code is ExitCode.OK and reply.run_id is not None
    await dispatcher.drain(30)
    said = [p for p in _outbox(ctx).of("post") if "break glass" in p.reply.title]
    assert said and "NCCL hang" in said[0].reply.title and said[0].channel == "C0DFLASH001"
    run = await ctx.runs.get(reply.run_id)
    assert run.break_glass == "NCCL hang" and run.approved_by is None
    marked = await dispatcher.audit.recent(outcomes={AuditOutcome.BREAK_GLASS}, count=5)
    assert marked[0].user == ADMIN and marked[0].run_id == reply.run_id and "NCCL hang" in marked[0].detail
    history = await dispatcher.handle(_req("history dflash", VIEWER))
    assert history.tables[0].rows[0][3] == "restart (break glass)"
    (decisions,) = [f for f in history.follow_ups if "two-person rule" in f.title]
    assert any(r[3] == "break_glass" and "NCCL hang" in r[4] for r in decisions.tables[0].rows)


async def test_store_refuses_self_approval_itself(ctx: Context, dispatcher: Dispatcher) -> None:
    """Even past the handler's check, the store's script never lets the requester approve."""
    rid = await _ask(dispatcher)
    store = ctx.redis.open_store(Approvals)
    decided, request = await store.decide(rid, ApprovalState.APPROVED, OPERATOR)
    assert decided.value == "self" and request.state is ApprovalState.PENDING


async def test_the_schedulers_tick_expires_a_dead_processs_request(
    tmp_path: Path, redis_handle: RedisHandle
) -> None:
    """A request whose process went away is closed at its expiry by the leader's verify tick."""
    from bot.runtime.scheduler import PitstopScheduler

    config = _config(tmp_path, expires=0.5)
    asker = Dispatcher(make_context(config, redis_handle), lock_ttl=5.0)
    rid = await _ask(asker)
    await asker.drain(0)  # its timer goes with it
    ctx = make_context(config, redis_handle)
    sched = PitstopScheduler(ctx, poll_interval=0.2)
    await sched.start()
    try:
        approvals = ctx.redis.open_store(Approvals)

        async def closed() -> bool:
            return (await approvals.find(rid)).state is ApprovalState.EXPIRED

        await wait_until(closed, timeout=15)
    finally:
        await sched.stop()
    last = [p for p in _outbox(ctx).of("announce") if p.key == f"run:{rid}"][-1].reply
    assert "expired after" in last.title and last.buttons == ()


async def test_unlock_waits_for_a_second_admin(tmp_path: Path, redis_handle: RedisHandle) -> None:
    """With unlock in actions, an admin's `unlock` waits; another admin's approval runs it for the
    requester; `approve` of a run that was never a request is a usage error (exit 2)."""
    ctx = make_context(_config(tmp_path, actions=["unlock"]), redis_handle)
    dispatcher = Dispatcher(ctx, lock_ttl=5.0)
    try:
        rid = await _ask(dispatcher, "unlock dflash", user=ADMIN)
        done = await dispatcher.handle(_req(f"approve {rid}", SECOND))
        assert done.exit_code is ExitCode.OK and "dflash" in done.title
        accepted = await dispatcher.audit.recent(outcomes={AuditOutcome.ACCEPTED}, count=5)
        assert accepted[0].user == ADMIN and accepted[0].verb == "unlock"
        unknown = await dispatcher.handle(_req("approve r-999", SECOND))
        assert unknown.exit_code is ExitCode.USAGE and unknown.title == approval_not_request("r-999")
    finally:
        await dispatcher.drain(30)


async def test_approval_while_a_restart_is_in_flight_keeps_the_request(
    dispatcher: Dispatcher, ctx: Context
) -> None:
    """Approving while another restart of the job holds its lock is refused (exit 4) without spending the
    request; once the lock is free the same approval runs it."""
    rid = await _ask(dispatcher)
    other = await dispatcher.handle(_req("restart dflash"))  # not held by the rule: takes the lock now
    assert other.exit_code is ExitCode.OK
    busy = await dispatcher.handle(_req(f"approve {rid}", ADMIN))
    assert busy.exit_code is ExitCode.IN_FLIGHT
    assert (await dispatcher.two_person.approvals.find(rid)).state is ApprovalState.PENDING
    await dispatcher.drain(30)
    assert (await dispatcher.handle(_req(f"approve {rid}", ADMIN))).title == queued(rid, "dflash")


async def test_the_requester_may_withdraw_their_own_request(dispatcher: Dispatcher, ctx: Context) -> None:
    """`deny r-N` by its requester (no approver) withdraws it: closed as denied by them, nothing runs."""
    rid = await _ask(dispatcher)
    reply = await dispatcher.handle(_req(f"deny {rid} wrong patch", OPERATOR))
    assert reply.exit_code is ExitCode.OK
    request = await dispatcher.two_person.approvals.find(rid)
    assert request.state is ApprovalState.DENIED and request.decided_by == OPERATOR
    assert await _restarter(ctx).calls() == []


def test_a_user_group_among_approvers_makes_slack_read_user_groups() -> None:
    """approvers = ["S…"] with no group in [auth]: Slack's surface still reads who is in which group,
    or nobody in the group could ever approve."""
    from bot.slack.app import needs_groups

    job = {"host": "h", "workdir": "/w", "launch": ["x"], "log": "/w/l", "match": "x"}
    base = {"hosts": {"h": {"address": "x"}}, "auth": {"admins": ["U0ADMIN0001"]}}
    plain = parse_config({**base, "jobs": {"dflash": job}})
    grouped = {**job, "approval": {"actions": ["restart"], "approvers": ["S0ONCALL01"]}}
    assert not needs_groups(plain)
    assert needs_groups(parse_config({**base, "jobs": {"dflash": grouped}}))


async def test_an_approval_whose_run_finds_the_lock_taken_is_not_spent(
    dispatcher: Dispatcher, ctx: Context
) -> None:
    """Another restart takes the job's lock between the approver's check and the run (an automatic
    restart, another replica): the approval is refused as in flight and the request is pending
    again, so approving it later runs it."""
    rid = await _ask(dispatcher)
    store = dispatcher.two_person.approvals
    real = store.decide

    async def racing(*args: Any, **kwargs: Any) -> Any:
        other = await dispatcher.handle(_req("restart dflash"))  # not under the rule: takes the lock
        assert other.exit_code is ExitCode.OK, other.title
        return await real(*args, **kwargs)

    store.decide = racing  # type: ignore[method-assign]
    try:
        reply = await dispatcher.handle(_req(f"approve {rid}", SECOND))
    finally:
        store.decide = real  # type: ignore[method-assign]
    assert reply.exit_code is ExitCode.IN_FLIGHT, reply.title
    assert (await store.find(rid)).state is ApprovalState.PENDING
    await dispatcher.drain(30)
    before = len(await _restarter(ctx).calls())
    again = await dispatcher.handle(_req(f"approve {rid}", SECOND))
    assert again.exit_code is ExitCode.OK, again.title
    await dispatcher.drain(30)
    assert len(await _restarter(ctx).calls()) == before + 1
    assert (await store.find(rid)).state is ApprovalState.APPROVED
