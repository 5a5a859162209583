"""The dispatcher: one path from text to action — fast answers, background sequences, exactly once,
confirmation, cancel, clear errors — and, end to end, the real restart sequence over SSH."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from bot.console.identity import CliIdentity
from handlers.context import Context
from handlers.outbox import MemoryOutbox
from handlers.reply import render_text
from handlers.request.dispatch import Dispatcher, Request
from handlers.text import (
    CONFIRM_GONE,
    DUPLICATE_DELIVERY,
    HISTORY_HEADERS,
    RUN_AWAITING_VERDICT,
    cancel_nothing,
    cancel_requested,
    confirm_ask,
    confirm_cancelled,
    confirm_expired,
    confirm_not_yours,
    history_title,
    launch_summary,
    lock_free,
    logs_title,
    queued,
    stop_summary,
    unknown_action,
)
from pipeline.config import Config
from pipeline.engines.runner import Runner
from pipeline.errors import HostUnreachable, internal_error
from pipeline.host.remote import SSHPool
from pipeline.state.audit import AuditOutcome
from pipeline.state.events import EventKind, Events
from pipeline.state.locks import Locks
from pipeline.state.redisconn import RedisHandle
from pipeline.state.runs import RunStore
from pipeline.verdict import Step, Verdict
from tests.support_handlers import (
    ADMIN,
    OPERATOR,
    VIEWER,
    StandInRestarter,
    handler_config,
    make_context,
    wait_until,
)

CONFIG = handler_config()


@pytest.fixture
def ctx(redis_handle: RedisHandle) -> Context:
    """A Context on real Redis with the stand-in restarter and a MemoryOutbox."""
    return make_context(CONFIG, redis_handle)


@pytest.fixture
async def dispatcher(ctx: Context) -> AsyncIterator[Dispatcher]:
    """A Dispatcher whose background work is drained after the test."""
    d = Dispatcher(ctx, lock_ttl=5.0, confirm_window=1.0)
    try:
        yield d
    finally:
        await d.drain(30)


def _req(text: str, user: str = OPERATOR, **kw: Any) -> Request:
    return Request(text=text, user=user, delivery_id=kw.pop("delivery_id", uuid.uuid4().hex), **kw)


def _outbox(ctx: Context) -> MemoryOutbox:
    assert isinstance(ctx.outbox, MemoryOutbox)
    return ctx.outbox


def _restarter(ctx: Context) -> StandInRestarter:
    assert isinstance(ctx.restarter, StandInRestarter)
    return ctx.restarter


async def test_restart_answers_at_once_and_runs_in_background(ctx: Context, dispatcher: Dispatcher) -> None:
    """A restart answers 'queued run r-1 for dflash' before any step ran, announces the run, then the
    background sequence updates the live message step by step and posts the launch summary in its thread."""
    _restarter(ctx).step_s = 0.3
    reply = await dispatcher.handle(_req("restart dflash with topk patch fresh cache"))
    assert reply.title == queued("r-1", "dflash")
    assert reply.exit_code == 0 and reply.run_id == "r-1" and reply.thread_key == "run:r-1"
    outbox = _outbox(ctx)
    first = outbox.of("announce")[0]
    assert (first.key, first.channel) == ("run:r-1", "C0ANNOUNCE1")
    assert first.reply.title == "r-1: restart of dflash by <@U0OPERATOR1> with topk patch, fresh cache"
    assert first.reply.steps == ()
    assert await _restarter(ctx).calls() == []  # nothing remote ran before the answer

    await dispatcher.drain(30)
    assert await _restarter(ctx).calls() == [
        {"action": "restart", "run": "r-1", "add": ["topk"], "remove": [], "fresh_cache": True}
    ]
    last = outbox.of("announce")[-1].reply
    assert [s.text().split(" ")[1] for s in last.steps] == [
        "preflight",
        "stop",
        "clear_cache",
        "patch",
        "launch",
        "verify:",
    ]
    assert last.steps[-1].text() == "… verify: waiting"
    assert [s.mark for s in last.steps[:5]] == ["✓"] * 5
    thread = outbox.of("thread")
    assert [p.reply.title for p in thread] == [launch_summary("r-1", "dflash", "pid 4242", 1.0)]
    assert await Locks(ctx.redis.client, ctx.redis.prefix).holder("job:dflash") is None


async def test_same_delivery_twice_acts_once(ctx: Context, dispatcher: Dispatcher) -> None:
    """A retried delivery (same id) is acted on once; the repeat is told it was already handled."""
    a, b = await asyncio.gather(
        dispatcher.handle(_req("restart dflash", delivery_id="ev:Ev0001")),
        dispatcher.handle(_req("restart dflash", delivery_id="ev:Ev0001")),
    )
    titles = sorted([a.title, b.title])
    assert titles == sorted([queued("r-1", "dflash"), DUPLICATE_DELIVERY])
    await dispatcher.drain(30)
    assert len(await _restarter(ctx).calls()) == 1
    assert await dispatcher.seen("ev:Ev0001")
    outcomes = [e.outcome for e in await dispatcher.audit.recent(count=10)]
    assert sorted(outcomes) == sorted([AuditOutcome.ACCEPTED, AuditOutcome.DUPLICATE])


async def test_double_clicked_confirmation_acts_once(ctx: Context, dispatcher: Dispatcher) -> None:
    """Two clicks on one Confirm button (same trigger id, or two ids) start one sequence."""
    ask = await dispatcher.handle(_req("restart guarded"))
    token = next(b.value for b in ask.buttons if b.action == "confirm")
    first, again, other_id = await asyncio.gather(
        dispatcher.handle_action("confirm", token, OPERATOR, "act:T1"),
        dispatcher.handle_action("confirm", token, OPERATOR, "act:T1"),
        dispatcher.handle_action("confirm", token, OPERATOR, "act:T2"),
    )
    titles = [first.title, again.title, other_id.title]
    assert titles.count(queued("r-1", "guarded")) == 1
    await dispatcher.drain(30)
    assert len(await _restarter(ctx).calls()) == 1


async def test_confirmation_by_the_same_user_runs(ctx: Context, dispatcher: Dispatcher) -> None:
    """A job with confirm = true waits for its requester's click; the click runs it and is audited."""
    ask = await dispatcher.handle(_req("restart guarded"))
    assert ask.ephemeral and ask.title == confirm_ask("restart guarded", "guarded", 1.0)
    assert [b.action for b in ask.buttons] == ["confirm", "cancel"]
    assert await _restarter(ctx).calls() == []
    token = ask.buttons[0].value
    done = await dispatcher.handle_action("confirm", token, OPERATOR, "act:1")
    assert done.title == queued("r-1", "guarded") and done.exit_code == 0
    await dispatcher.drain(30)
    assert [c["action"] for c in await _restarter(ctx).calls()] == ["restart"]
    outcomes = [e.outcome for e in await dispatcher.audit.recent(count=10)]
    assert outcomes[:2] == [AuditOutcome.CONFIRMED, AuditOutcome.PENDING]


async def test_confirmation_by_another_user_is_refused(ctx: Context, dispatcher: Dispatcher) -> None:
    """Someone else's click is refused (exit 3) and leaves the confirmation to its requester."""
    ask = await dispatcher.handle(_req("restart guarded"))
    token = ask.buttons[0].value
    other = await dispatcher.handle_action("confirm", token, ADMIN, "act:2")
    assert other.title == confirm_not_yours(OPERATOR) and other.exit_code == 3 and other.ephemeral
    assert await _restarter(ctx).calls() == []
    mine = await dispatcher.handle_action("confirm", token, OPERATOR, "act:3")
    assert mine.title == queued("r-1", "guarded")
    denied = await dispatcher.audit.recent(outcomes={AuditOutcome.DENIED}, count=5)
    assert [e.user for e in denied] == [ADMIN]


async def test_unconfirmed_request_is_cancelled_and_says_so(ctx: Context, dispatcher: Dispatcher) -> None:
    """Without a click within the window the request is cancelled, the requester is told privately
    (its prompt named), it is audited, and a late click does nothing."""
    ask = await dispatcher.handle(_req("restart guarded", channel="C0REQUEST01"))
    token = ask.buttons[0].value
    expired = confirm_expired("restart guarded", 1.0)

    async def said() -> bool:
        return any(p.reply.title == expired for p in _outbox(ctx).of("tell"))

    await wait_until(said, timeout=10)
    told = _outbox(ctx).of("tell")[0]
    assert told.channel == OPERATOR and told.key == token and told.reply.exit_code == 5
    assert _outbox(ctx).of("post") == []  # privately, never in the channel
    cancelled = await dispatcher.audit.recent(outcomes={AuditOutcome.CANCELLED}, count=5)
    assert [e.detail for e in cancelled] == [expired]
    late = await dispatcher.handle_action("confirm", token, OPERATOR, "act:late")
    assert late.title == CONFIRM_GONE and late.exit_code == 5
    assert await _restarter(ctx).calls() == []


async def test_requester_can_decline(ctx: Context, dispatcher: Dispatcher) -> None:
    """The Cancel button settles the confirmation: nothing runs, exit 5, audited."""
    ask = await dispatcher.handle(_req("stop guarded"))
    reply = await dispatcher.handle_action("cancel", ask.buttons[1].value, OPERATOR, "act:c")
    assert reply.title == confirm_cancelled("stop guarded", OPERATOR) and reply.exit_code == 5
    assert await _restarter(ctx).calls() == []


async def test_cancel_stops_the_run_at_the_next_step_boundary(ctx: Context, dispatcher: Dispatcher) -> None:
    """``cancel JOB`` names the in-flight run; the sequence ends CANCELLED at its next boundary and
    the verdict is posted in the run's thread and published as an event."""
    _restarter(ctx).step_s = 0.5
    after = await ctx.events.last_id()
    await dispatcher.handle(_req("restart dflash"))

    async def at_stop() -> bool:
        holder = await Locks(ctx.redis.client, ctx.redis.prefix).holder("job:dflash")
        return holder is not None and holder.step == "stop"

    await wait_until(at_stop)
    reply = await dispatcher.handle(_req("cancel dflash", user=ADMIN))
    assert reply.title == cancel_requested("r-1", "dflash") and reply.run_id == "r-1"
    await dispatcher.drain(30)
    run = await ctx.runs.get("r-1")
    assert run.verdict is Verdict.CANCELLED and run.step(Step.LAUNCH) is None
    assert _outbox(ctx).of("thread")[-1].reply.title == run.verdict_line
    event = await ctx.events.wait_for(EventKind.VERDICT, "dflash", after=after, timeout=5)
    assert event is not None and event.data["verdict"] == "CANCELLED"
    nothing = await dispatcher.handle(_req("cancel dflash"))
    assert nothing.title == cancel_nothing("dflash") and nothing.exit_code == 1


async def test_stop_posts_its_summary(ctx: Context, dispatcher: Dispatcher) -> None:
    """``stop JOB`` takes the lock, runs the stop step only, and posts the stop summary."""
    reply = await dispatcher.handle(_req("stop dflash"))
    assert reply.run_id == "r-1"
    await dispatcher.drain(30)
    assert [c["action"] for c in await _restarter(ctx).calls()] == ["stop"]
    thread = _outbox(ctx).of("thread")
    assert thread[-1].reply.title == stop_summary("r-1", "dflash")


async def test_expected_failure_is_a_clear_reply(redis_handle: RedisHandle) -> None:
    """A PitstopError is shown as its message with its exit code, and audited as failed."""
    ctx = make_context(CONFIG, redis_handle)
    _restarter(ctx).log_error = HostUnreachable("gpu1", "connection refused")
    d = Dispatcher(ctx)
    reply = await d.handle(_req("logs dflash", user=VIEWER))
    assert reply.title == "host gpu1 unreachable: connection refused" and reply.exit_code == 1
    failed = await d.audit.recent(outcomes={AuditOutcome.FAILED}, count=1)
    assert failed[0].detail == reply.title


async def test_unexpected_failure_gives_an_incident_id_not_a_traceback(
    redis_handle: RedisHandle, caplog: pytest.LogCaptureFixture
) -> None:
    """Anything else is logged with its traceback; the person gets one line with an incident id."""
    ctx = make_context(CONFIG, redis_handle)
    _restarter(ctx).log_error = RuntimeError("secret internals")
    d = Dispatcher(ctx)
    with caplog.at_level(logging.ERROR, logger="handlers.request.dispatch"):
        reply = await d.handle(_req("logs dflash", user=VIEWER))
    text = render_text(reply)
    assert "secret" not in text and "Traceback" not in text and reply.exit_code == 1
    incident = reply.title.split("incident ")[1].split(")")[0]
    assert reply.title == internal_error(incident)
    assert any(incident in r.getMessage() and r.exc_info for r in caplog.records)
    errors = await d.audit.recent(outcomes={AuditOutcome.ERROR}, count=1)
    assert errors[0].detail == f"incident {incident}"


async def test_reads_answer_inline(ctx: Context, dispatcher: Dispatcher) -> None:
    """logs, patches, lock and help answer directly with what a person needs."""
    logs = await dispatcher.handle(_req("logs dflash 5", user=VIEWER))
    assert logs.title == logs_title(5, "/srv/w/train.log", "dflash") and logs.log == "step 1\nstep 2\n"
    patches = await dispatcher.handle(_req("patches dflash", user=VIEWER))
    assert dict(patches.fields) == {"available": "topk, fast, old", "in effect": "none"}
    lock = await dispatcher.handle(_req("lock dflash", user=VIEWER))
    assert lock.title == lock_free("dflash")
    helped = await dispatcher.handle(_req("help", user=VIEWER))
    listed = " ".join(helped.lines)
    for verb in ("restart", "start", "stop", "cancel", "status", "logs", "digest", "history", "patches"):
        assert f"`{verb} " in listed or f"`{verb}`" in listed
    one = await dispatcher.handle(_req("help restart", user=VIEWER))
    assert one.title.startswith("usage: restart JOB")
    assert "type `/train help VERB`" in helped.lines[-1]  # in Slack a verb follows the slash command
    typed = await dispatcher.handle(_req("help", user=VIEWER, surface="console"))
    assert "type `help VERB`" in typed.lines[-1]  # in the console it is typed alone


async def test_history_shows_runs_and_refusals(ctx: Context, dispatcher: Dispatcher) -> None:
    """``history`` is a table of the last runs with their verdicts and who asked through which surface,
    plus recent denied/refused requests."""
    await dispatcher.handle(_req("restart dflash with topk patch"))
    await dispatcher.handle(_req("restart dflash", user=VIEWER))  # denied
    await dispatcher.handle(_req("restart dflash", user=ADMIN))  # refused: in flight
    await dispatcher.drain(30)
    reply = await dispatcher.handle(_req("history dflash 5", user=VIEWER))
    assert reply.title == history_title("dflash", 1)
    (runs,) = reply.tables
    assert runs.headers == HISTORY_HEADERS
    row = runs.rows[0]
    assert row[0] == "r-1" and row[2] == "<@U0OPERATOR1> (slack)" and row[3] == "restart" and row[4] == "topk"
    assert row[5] == RUN_AWAITING_VERDICT
    (refusals,) = reply.follow_ups
    outcomes = [r[3] for r in refusals.tables[0].rows]
    assert outcomes == ["refused", "denied"]
    assert [r[1] for r in refusals.tables[0].rows] == [f"<@{ADMIN}> (slack)", f"<@{VIEWER}> (slack)"]


async def test_watch_and_ack_go_to_the_ack_handlers(
    ctx: Context, dispatcher: Dispatcher, monkeypatch: pytest.MonkeyPatch
) -> None:
    """watch/ack are parsed, authorised and audited here, then handed to handlers.watch.acks."""
    import handlers.watch.acks as acks
    from handlers.reply import Reply

    seen: list[tuple[Any, ...]] = []

    async def watch_command(c: Context, job: str, state: str, for_s: int | None, user: str) -> Reply:
        seen.append(("watch", job, state, for_s, user))
        return Reply(title="paused")

    async def ack_command(c: Context, job: str, user: str) -> Reply:
        seen.append(("ack", job, user))
        return Reply(title="acked")

    monkeypatch.setattr(acks, "watch_command", watch_command)
    monkeypatch.setattr(acks, "ack_command", ack_command)
    assert (await dispatcher.handle(_req("watch DFLASH off for 2h"))).title == "paused"
    assert (await dispatcher.handle(_req("ack dflash"))).title == "acked"
    assert seen == [("watch", "dflash", "off", 7200, OPERATOR), ("ack", "dflash", OPERATOR)]
    denied = await dispatcher.handle(_req("ack dflash", user=VIEWER))
    assert denied.exit_code == 3 and len(seen) == 2


# --- end to end: the real Restarter over the in-process SSH host ------------------------------------


def _with_redis(config: Config, redis_config: Config) -> Config:
    return config.model_copy(update={"redis": redis_config.redis, "state": redis_config.state})


async def test_real_restart_end_to_end(
    ssh_server: Any, job_factory: Any, redis_handle: RedisHandle, redis_config: Config
) -> None:
    """start, status, logs, restart and history through the dispatcher with the real Restarter over
    SSH: the verdict is RUNNING, status shows the job running with its PID and process count."""
    setup = job_factory(ssh_server, opts=("workers=0",))
    config = _with_redis(setup.config, redis_config).model_copy(
        update={"auth": handler_config().auth.model_copy(update={"operators": ["*"]})}
    )
    ssh = SSHPool(config)
    runs = RunStore(redis_handle.client, redis_handle.prefix)
    events = Events(redis_handle.client, redis_handle.prefix)
    outbox = MemoryOutbox()
    ctx = Context(config, redis_handle, ssh, runs, Runner(config, ssh, runs, events), events, outbox, "e2e")
    d = Dispatcher(ctx)
    try:
        started = await d.handle(_req("start trainer"))
        assert started.run_id == "r-1", render_text(started)
        await d.drain(60)
        run = await ctx.service.deliver("r-1")
        assert run is not None and run.verdict is Verdict.RUNNING, run and run.evidence

        status = await d.handle(_req("status", user=VIEWER))
        (table,) = status.tables
        row = dict(zip(table.headers, table.rows[0], strict=True))
        assert row["job"] == "trainer" and row["state"] == "running" and row["procs"] == "1/1"
        assert row["pid"] == str(run.pid) and row["last restart"].startswith("r-1 start")

        logs = await d.handle(_req("logs trainer 3", user=VIEWER))
        assert logs.log is not None and "step" in logs.log

        twice = await d.handle(_req("start trainer"))  # already running: refused by pre-flight
        await d.drain(60)
        refused = await ctx.runs.get(twice.run_id or "")
        assert refused.verdict is Verdict.PREFLIGHT_FAILED
        post = [p for p in outbox.of("thread") if p.key == "run:r-2"][-1].reply
        assert post.title == refused.verdict_line and post.status.value == "error"
        headline = [p for p in outbox.of("announce") if p.key == "run:r-2"][-1].reply
        assert headline.lines[-1] == refused.verdict_line and headline.steps[0].mark == "✗"

        again = await d.handle(_req("restart trainer"))
        assert again.run_id == "r-3"
        await d.drain(60)
        second = await ctx.service.deliver("r-3")
        assert second is not None and second.verdict is Verdict.RUNNING and second.old_pid == run.pid
        history = await d.handle(_req("history", user=VIEWER))
        rows = history.tables[0].rows
        assert [r[0] for r in rows] == ["r-3", "r-2", "r-1"]
        assert rows[1][5] == refused.verdict_line and rows[0][5] == second.verdict_line

        stopped = await d.handle(_req("stop trainer"))
        await d.drain(60)
        final = await ctx.runs.get(stopped.run_id or "")
        assert final.verdict is None and final.finished_at is not None
        status = await d.handle(_req("status trainer", user=VIEWER))
        assert status.tables[0].rows[0][1] == "stopped"
    finally:
        await d.drain(30)
        stop = await d.handle(_req("stop trainer"))
        await d.drain(60)
        await ssh.close()
        assert stop.exit_code in (0, 4)


async def test_say_runs_the_slack_path_and_waits_for_the_verdict(
    ssh_server: Any, job_factory: Any, redis_handle: RedisHandle, redis_config: Config
) -> None:
    """``pitstop say "start trainer" --wait --json`` acts through the dispatcher, waits for the verified
    verdict and exits 0; a denied request exits 3 and a bad one 2."""
    from bot.console.say import say_main

    setup = job_factory(ssh_server)
    config = _with_redis(setup.config, redis_config).model_copy(
        update={"auth": handler_config().auth.model_copy(update={"operators": ["U0SAYER0001"]})}
    )
    out, err = io.StringIO(), io.StringIO()
    try:
        code = await say_main(
            config,
            "start trainer",
            who=CliIdentity("U0SAYER0001", "tester"),
            wait=True,
            as_json=True,
            out=out,
            err=err,
        )
        assert code == 0, out.getvalue() + err.getvalue()
        data = json.loads(out.getvalue())
        assert data["title"] == queued("r-1", "trainer")
        launch, verdict = data["follow_ups"]
        assert launch["title"].startswith("r-1: trainer launched as pid")
        assert verdict["title"].startswith("RUNNING 1/1 processes") and verdict["status"] == "ok"
        assert verdict["log_title"] == "evidence from trainer" and data["exit_code"] == 0
        out = io.StringIO()
        assert (
            await say_main(
                config,
                "stop trainer",
                who=CliIdentity("console", "tester"),
                wait=False,
                as_json=False,
                out=out,
                err=err,
            )
            == 3
        )
        assert "may not `stop trainer`" in out.getvalue()
        out = io.StringIO()
        assert (
            await say_main(
                config,
                "stop trainr",
                who=CliIdentity("console", "tester"),
                wait=False,
                as_json=False,
                out=out,
                err=err,
            )
            == 2
        )
    finally:
        out = io.StringIO()
        await say_main(
            config,
            "stop trainer",
            who=CliIdentity("U0SAYER0001", "tester"),
            wait=False,
            as_json=False,
            out=out,
            err=err,
        )


async def test_show_log_button_answers_with_the_log(ctx: Context, dispatcher: Dispatcher) -> None:
    """The Show log button of a failed verdict answers with the job's log (viewer role, audited)."""
    reply = await dispatcher.handle_action("show_log", "dflash", VIEWER, "act:log")
    assert reply.log == "step 1\nstep 2\n" and reply.exit_code == 0
    unknown = await dispatcher.handle_action("show_log", "dflsh", VIEWER, "act:log2")
    assert unknown.exit_code == 2 and "did you mean 'dflash'" in unknown.title
    odd = await dispatcher.handle_action("reboot", "x", VIEWER, "act:odd")
    assert odd.title == unknown_action("reboot") and odd.exit_code == 2


def test_run_view_shows_who_what_steps_and_verdict() -> None:
    """The live message reads who asked for what, each step with ✓/✗ and seconds, a waiting verify,
    and the verdict line last; the verdict post carries the evidence and a Show log button on failure."""
    from handlers.runs.view import run_reply, verdict_reply
    from pipeline.state.runs import RunRecord, StepRecord
    from pipeline.verdict import Outcome

    t = 1_000_000.0
    run = RunRecord(
        id="r-42",
        job="dflash",
        requested_by="U0OPERATOR1",
        created_at=t,
        patches=["topk", "fast"],
        fresh_cache=True,
        steps=[
            StepRecord(step=Step.PREFLIGHT, started_at=t, ended_at=t + 0.4, outcome=Outcome.OK, detail="ok"),
            StepRecord(step=Step.STOP, started_at=t + 1, ended_at=t + 3.1, outcome=Outcome.OK),
            StepRecord(step=Step.LAUNCH, started_at=t + 4, ended_at=t + 4.2, outcome=Outcome.OK),
        ],
        pid=4242,
    )
    live = run_reply(run, CONFIG)
    assert live.title == "r-42: restart of dflash by <@U0OPERATOR1> with topk and fast patches, fresh cache"
    assert [s.text() for s in live.steps] == [
        "✓ preflight 0.4 s - ok",
        "✓ stop 2.1 s",
        "✓ launch 0.2 s",
        "… verify: waiting",
    ]
    assert live.thread_key == "run:r-42" and live.run_id == "r-42" and live.status.value == "info"
    assert dict(live.fields) == {"host": "gpu1", "pid": "4242"}
    failed = run.model_copy(
        update={
            "verdict": Verdict.EXITED,
            "verdict_line": "EXITED code 1 after 3 s",
            "evidence": "Traceback …",
        }
    )
    done = run_reply(failed, CONFIG)
    assert done.lines[-1] == "EXITED code 1 after 3 s" and done.status.value == "error"
    post = verdict_reply(failed)
    assert (post.title, post.log, post.status.value, int(post.exit_code)) == (
        "EXITED code 1 after 3 s",
        "Traceback …",
        "error",
        1,
    )
    assert [(b.action, b.value) for b in post.buttons] == [("show_log", "dflash")]
    ok = verdict_reply(run.model_copy(update={"verdict": Verdict.RUNNING, "verdict_line": "RUNNING 8/8"}))
    assert ok.status.value == "ok" and ok.buttons == () and int(ok.exit_code) == 0
