"""The twelve delivery defects of issue 13, each as a scenario against the strict Slack stand-in:
alerts page for real, long answers split, refusals reach a person, no double posts, charts to
channels the bot has not joined, buttons honour groups, Show log in the thread, expired
confirmations told privately, every digest chart uploaded, people as names, no empty text or
broken fence or ping from job output, a quiet App Home."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from slack_bolt.context.respond.async_respond import AsyncRespond

from bot.runtime.serve import serve
from bot.slack import blocks
from bot.slack.api import ATTEMPTS, Delivery, web_client
from bot.slack.outbox import SlackOutbox
from bot.text import slack_continued, slack_home_no_role, slack_part
from handlers.reply import Reply, Status, Table
from handlers.text import confirm_expired
from handlers.watch.alerts import alert_reply
from pipeline.config import AuthSettings, Config, SlackSettings
from pipeline.errors import ConfigError, ExitCode
from pipeline.state import keys
from pipeline.state.audit import AuditOutcome
from pipeline.state.incidents import Incident, IncidentKind
from tests.fixtures.slack import (
    ANNOUNCE,
    BOT_TOKEN,
    Call,
    Channel,
    FakeSlack,
    block_action,
    form_body,
    manifest_scopes,
    validate_blocks,
)
from tests.fixtures.ssh import InProcessHost, JobFactory
from tests.test_ownership import write_config
from tests.test_slack_http import MakeStack, Stack, make_stack  # noqa: F401 (a fixture)

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
async def served(make_stack: MakeStack) -> Stack:  # noqa: F811
    """The served HTTP stack (tests/test_slack_http.py) with a quiet job that is not running."""
    return await make_stack()


@pytest.fixture
async def build(make_stack: MakeStack) -> MakeStack:  # noqa: F811
    """Builds a served stack with options (``make_stack``)."""
    return make_stack


def _outbox(fake: FakeSlack, **kw: object) -> SlackOutbox:
    return SlackOutbox(
        web_client(BOT_TOKEN, base_url=fake.api_url), Delivery(default_channel=ANNOUNCE, pace=0, **kw)
    )  # type: ignore[arg-type]


def _texts(msg: dict[str, object]) -> str:
    return "\n".join(blocks.block_texts(msg["blocks"]))  # type: ignore[arg-type]


def _incident() -> Incident:
    now = time.time()
    return Incident(
        n=1,
        job="dflash",
        host="gpu1",
        kind=IncidentKind.DEAD,
        opened_at=now,
        notified_at=now,
        count=0,
        expected=8,
    )


# --- 1. alert_mention pages for real --------------------------------------------------------------


async def test_1_alert_mention_pages_here_channel_groups_and_users(
    fake_slack: FakeSlack, redis_config: Config
) -> None:
    """An alert with alert_mention here/channel/S…/U… carries <!here>, <!channel>, <!subteam^S…>, <@U…> unescaped."""
    outbox = _outbox(fake_slack)
    expected = {
        "here": "<!here>",
        "channel": "<!channel>",
        "S0ONCALL": "<!subteam^S0ONCALL>",
        "U0ONCALL1": "<@U0ONCALL1>",
    }
    for target, ref in expected.items():
        config = redis_config.model_copy(update={"slack": SlackSettings(alert_mention=target, pace=0)})
        await outbox.post(alert_reply(_incident(), config), ANNOUNCE)
        posted = fake_slack.posted_to(ANNOUNCE)[-1]
        assert ref in _texts(posted) and ref in str(posted["text"]), target
        assert "&lt;" not in _texts(posted)


def test_1_check_config_rejects_an_alert_mention_that_cannot_page(tmp_path: Path) -> None:
    """check-config refuses alert_mention = "oncall" (exit 2), naming slack.alert_mention."""
    config = (
        (ROOT / "pitstop.example.toml")
        .read_text()
        .replace('alert_mention = "S0123456789"', 'alert_mention = "oncall"')
    )
    assert 'alert_mention = "oncall"' in config
    path = tmp_path / "pitstop.toml"
    path.write_text(config)
    done = subprocess.run(
        [sys.executable, "-m", "bot.cli", "check-config", str(path)], capture_output=True, text=True, cwd=ROOT
    )
    assert done.returncode == ExitCode.USAGE
    assert "slack.alert_mention: 'oncall' cannot page anyone" in done.stderr


# --- 2. long answers are split, never refused --------------------------------------------------------


def _rows(n: int) -> Table:
    return Table(
        ("job", "state", "last restart"),
        tuple((f"job-{i:04d}", "running", "r-1 " + "x" * 60) for i in range(n)),
    )


async def test_2_long_answer_is_split_into_the_thread_with_a_marker(fake_slack: FakeSlack) -> None:
    """A 400-row listing (≈30,000 characters) is posted as several accepted messages, the rest in the thread, every row shown."""
    outbox = _outbox(fake_slack)
    await outbox.post(Reply(title="history dflash 400", tables=(_rows(400),)), ANNOUNCE)
    assert await fake_slack.calls("chat.postMessage", ok=False) == []
    head, *rest = fake_slack.posted_to(ANNOUNCE)
    assert rest and all(m["thread_ts"] == head["ts"] for m in rest)
    assert slack_continued(len(rest)) in _texts(head)
    assert _texts(rest[-1]).startswith(slack_part(len(rest) + 1, len(rest) + 1, "history dflash 400"))
    shown = "\n".join(_texts(m) for m in (head, *rest))
    assert all(f"job-{i:04d}" in shown for i in range(400))
    assert all(blocks.block_chars(m["blocks"]) <= blocks.MAX_MESSAGE_CHARS for m in (head, *rest))  # type: ignore[arg-type]


async def test_2_answer_too_long_for_10_messages_is_attached_as_a_text_file(fake_slack: FakeSlack) -> None:
    """A 3,000-row answer posts 10 messages, the last saying the rest is attached, and the whole text as a file in the thread."""
    outbox = _outbox(fake_slack)
    await outbox.post(Reply(title="history dflash 3000", tables=(_rows(3000),)), ANNOUNCE)
    head, *rest = fake_slack.posted_to(ANNOUNCE)
    assert len(rest) + 1 == blocks.MAX_PARTS
    assert "in the attached text file" in _texts(rest[-1])
    (done,) = await fake_slack.wait_for("files.completeUploadExternal")
    assert done.args["thread_ts"] == head["ts"]
    data = fake_slack.uploads[done.args["files"][0]["id"]]["data"].decode()
    assert "job-0000" in data and "job-2999" in data


async def test_2_long_answer_through_the_response_url_is_split_within_its_5_uses(served: Stack) -> None:
    """An answer through the response_url is split over at most 5 accepted posts, the first saying more follow."""
    url = served.fake.response_url()
    reply = Reply(title="status of many jobs", tables=(_rows(300),))
    await served.runtime.surface._respond(AsyncRespond(response_url=url), reply, user="U0OPERATOR1")
    posts = await served.fake.calls("response_url")
    assert 1 < len(posts) <= 5 and all(c.ok for c in posts)
    assert "continued in" in "\n".join(blocks.block_texts(posts[0].args["blocks"]))


# --- 3. a refused post reaches a person; /healthz and status show it ---------------------------------


async def test_3_refused_run_post_is_told_to_the_requester_with_the_fix(fake_slack: FakeSlack) -> None:
    """A run headline refused (not_in_channel, private channel) reaches the requester by DM saying to invite the bot."""
    fake_slack.add_channel(Channel("G0PRIVATE", public=False, member=False))
    outbox = _outbox(fake_slack)
    outbox.requested_by("run:r-1", "U0OPERATOR1")
    await outbox.announce("run:r-1", Reply(title="r-1: restart of dflash", run_id="r-1"), "G0PRIVATE")
    (dm,) = await fake_slack.wait_for("chat.postMessage", where=lambda c: c.args["channel"].startswith("D"))
    assert (await fake_slack.calls("conversations.open"))[0].args["users"] == "U0OPERATOR1"
    assert "not_in_channel" in dm.args["text"] and "/invite @pitstop" in dm.args["text"]
    assert outbox.last_failure is not None and outbox.last_failure["error"] == "not_in_channel"


async def test_3_refused_alert_goes_to_the_announce_channel(fake_slack: FakeSlack) -> None:
    """An alert whose job channel is archived is announced in the announce channel, naming the error and the fix."""
    fake_slack.add_channel(Channel("C0ARCHIVED", archived=True))
    outbox = _outbox(fake_slack)
    await outbox.announce("incident:dflash:1", Reply(title="dflash is down"), "C0ARCHIVED")
    (notice,) = fake_slack.posted_to(ANNOUNCE)
    assert "is_archived" in str(notice["text"]) and "dflash is down" in str(notice["text"])


async def test_3_alert_with_no_channel_goes_down_the_chain_to_the_admins_by_dm(fake_slack: FakeSlack) -> None:
    """With no job channel and no announce channel an alert goes to the fallback channel; with no fallback
    either, to the admins by DM; one that reaches no one is recorded as undelivered (for /healthz)."""
    client = web_client(BOT_TOKEN, base_url=fake_slack.api_url)
    fallback = SlackOutbox(client, Delivery(pace=0, fallback_channel=ANNOUNCE))
    await fallback.announce("incident:tj:1", Reply(title="tj is down"), None)
    assert [m["text"] for m in fake_slack.posted_to(ANNOUNCE)] == ["tj is down"]

    admins = SlackOutbox(client, Delivery(pace=0, page_by_dm=lambda key: ["U0ADMIN"]))
    await admins.announce("incident:tj:2", Reply(title="tj is down again"), None)
    (dm,) = await fake_slack.wait_for("chat.postMessage", where=lambda c: c.args["channel"].startswith("D"))
    assert (await fake_slack.calls("conversations.open"))[-1].args["users"] == "U0ADMIN"
    assert "tj is down again" in dm.args["text"] and "set [slack] announce_channel" in dm.args["text"]
    assert admins.last_undelivered is not None and admins.last_undelivered["told"] == ["U0ADMIN"]

    nobody = SlackOutbox(client, Delivery(pace=0))
    await nobody.announce("incident:tj:3", Reply(title="tj is down once more"), None)
    assert nobody.last_undelivered is not None
    assert (
        nobody.last_undelivered["title"] == "tj is down once more" and nobody.last_undelivered["told"] == []
    )
    assert nobody.last_undelivered["error"] == "no_channel"


async def test_3_serve_refuses_a_config_whose_alerts_reach_no_channel(
    fake_slack: FakeSlack,
    redis_config: Config,
    ssh_server: InProcessHost,
    job_factory: JobFactory,
    tmp_path: Path,
) -> None:
    """`serve` with no announce channel and a job without a channel refuses to start, naming the key to set
    (before it opens anything); `check-config` says ok with a warning about the same."""
    setup = job_factory(ssh_server)
    config = setup.config.model_copy(update={"redis": redis_config.redis, "state": redis_config.state})
    assert not config.slack.announce_channel and not config.jobs[setup.name].channel
    with pytest.raises(
        ConfigError, match=r"alerts of .* would reach no channel: set \[slack\] announce_channel"
    ):
        await serve(config, bot_token=BOT_TOKEN, api_url=fake_slack.api_url, signing_secret="s", host=None)
    assert await fake_slack.calls("auth.test") == []
    path = write_config(tmp_path / "pitstop.toml", setup, redis_config)
    done = subprocess.run(
        [sys.executable, "-m", "bot.cli", "check-config", str(path)], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0 and ": ok - " in done.stdout, done
    assert f"warning: alerts of {setup.name} would reach no channel" in done.stderr
    assert f"[jobs.{setup.name}] channel" in done.stderr


async def test_3_transient_errors_are_retried_and_ratelimited_exhaustion_is_reported(
    fake_slack: FakeSlack,
) -> None:
    """A 503 before storing is retried once the backoff passes; 429s past every retry are a reported refusal."""
    outbox = _outbox(fake_slack, backoff=0.05)
    fake_slack.fail_next("chat.postMessage", status=503, store=False)
    await outbox.post(Reply(title="digest"), "C0OTHER")
    assert [m["text"] for m in fake_slack.posted_to("C0OTHER")] == ["digest"]
    for _ in range(4 * ATTEMPTS):  # each of the outbox's tries: the first call and slack_sdk's 3 waits
        fake_slack.rate_limit_next("chat.postMessage", retry_after=0)
    await outbox.post(Reply(title="never arrives"), "C0OTHER")
    assert outbox.last_failure is not None and outbox.last_failure["error"] == "ratelimited"
    assert any("ratelimited" in str(m["text"]) for m in fake_slack.posted_to(ANNOUNCE))


async def test_3_healthz_and_status_show_the_last_delivery_failure(served: Stack) -> None:
    """After a refused post, /healthz/details carries it and `status` has a line about it."""
    await served.runtime.outbox.post(Reply(title="digest"), "C0NOSUCH")
    state = await served.details()
    assert state["slack"]["last_delivery_failure"]["error"] == "channel_not_found"
    answer = await served.answer(f"status {served.job}")
    assert "last Slack delivery failure" in "\n".join(blocks.block_texts(answer["blocks"]))


# --- 4. a retry cannot post twice ----------------------------------------------------------------------


async def test_4_unknown_outcome_is_looked_up_not_posted_again(fake_slack: FakeSlack) -> None:
    """A post stored but answered with a reset, or with a 500, is found by its metadata: one message each."""
    outbox = _outbox(fake_slack, backoff=0.05)
    fake_slack.fail_next("chat.postMessage", reset=True)
    await outbox.post(Reply(title="once"), ANNOUNCE)
    fake_slack.fail_next("chat.postMessage", status=500)
    await outbox.announce(
        "run:r-9", Reply(title="headline", follow_ups=(Reply(title="in thread"),)), ANNOUNCE
    )
    assert [m["text"] for m in fake_slack.posted_to(ANNOUNCE)] == ["once", "headline", "in thread"]
    assert await fake_slack.calls("conversations.history", ok=True)
    assert outbox.failures == []


async def test_4_reset_in_a_thread_is_looked_up_in_the_thread(fake_slack: FakeSlack) -> None:
    """A thread post reset after storing is looked up with conversations.replies and not repeated."""
    outbox = _outbox(fake_slack, backoff=0.05)
    await outbox.announce("run:r-3", Reply(title="headline"), ANNOUNCE)
    fake_slack.fail_next("chat.postMessage", reset=True)
    await outbox.thread("run:r-3", Reply(title="verdict RUNNING"), ANNOUNCE)
    head = fake_slack.posted_to(ANNOUNCE)[0]
    assert [m["text"] for m in fake_slack.thread(ANNOUNCE, str(head["ts"]))] == ["verdict RUNNING"]
    assert await fake_slack.calls("conversations.replies", ok=True)


async def test_4_without_a_lookup_the_post_is_reported_not_repeated() -> None:
    """When the look-up is refused (no channels:history), a reset post is not sent again but reported."""
    async with FakeSlack(scopes=manifest_scopes() - {"channels:history"}) as fake:
        outbox = _outbox(fake, backoff=0.05)
        fake.fail_next("chat.postMessage", reset=True)
        await outbox.post(Reply(title="once"), "C0OTHER")
        assert [m["text"] for m in fake.posted_to("C0OTHER")] == ["once"]
        assert outbox.last_failure is not None and outbox.last_failure["error"] == "outcome_unknown"
        assert any("does not post twice" in str(m["text"]) for m in fake.posted_to(ANNOUNCE))


# --- 5. charts to a channel the bot has not joined ------------------------------------------------------


def _png(tmp_path: Path, name: str = "chart.png") -> Path:
    path = tmp_path / name
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + b"0" * 500)
    return path


async def test_5_chart_upload_joins_a_public_channel_or_says_how_to_invite(
    fake_slack: FakeSlack, tmp_path: Path
) -> None:
    """A chart for a public channel the bot is not in is uploaded after conversations.join; a private one is reported with /invite."""
    fake_slack.add_channel(Channel("C0PUBLIC", member=False))
    fake_slack.add_channel(Channel("G0SECRET", public=False, member=False))
    outbox = _outbox(fake_slack)
    assert await outbox.upload(str(_png(tmp_path)), "C0PUBLIC", thread_ts=None, title="digest")
    assert fake_slack.channels["C0PUBLIC"].member
    (done,) = await fake_slack.wait_for("files.completeUploadExternal")
    assert done.args["channel_id"] == "C0PUBLIC"
    assert not await outbox.upload(str(_png(tmp_path)), "G0SECRET", thread_ts=None, title="digest")
    assert any("/invite @pitstop" in str(m["text"]) for m in fake_slack.posted_to(ANNOUNCE))


# --- 6. buttons honour user groups -------------------------------------------------------------------------


async def _click(served: Stack, action: str, value: str, user: str, **payload_fields: object) -> Call:
    url = served.fake.response_url()
    payload = block_action(f"pitstop:{action}:0", value, user=user, response_url=url)
    payload.update(payload_fields)
    status, _, _ = await served.post(form_body({"payload": json.dumps(payload)}))
    assert status == 200
    (answer,) = await served.fake.wait_for(
        "response_url", where=lambda c: c.path.endswith(url.rsplit("/", 1)[1])
    )
    return answer


async def test_6_button_click_honours_the_clickers_user_group(build: MakeStack) -> None:
    """With operators = S0ONCALL, a member's Cancel click on a run is not denied; a non-member's is."""
    served = await build(operators=("S0ONCALL",))
    started = await served.answer(f"start {served.job}")
    assert started["text"].startswith("queued run r-1")
    member = await _click(served, "cancel", "r-1", "U0OPERATOR1")
    other = await _click(served, "cancel", "r-1", "U0SOMEONE")
    assert "operator role" not in member.args["text"]
    assert "operator role" in other.args["text"]
    denied = await served.runtime.dispatcher.audit.recent(outcomes={AuditOutcome.DENIED}, count=5)
    assert [e.user for e in denied] == ["U0SOMEONE"]


# --- 7. Show log answers in the run's thread ---------------------------------------------------------------


async def test_7_show_log_answers_in_the_thread_it_was_clicked_in(served: Stack) -> None:
    """A Show log click on a verdict in a run's thread posts the log in that thread, not at the top of the channel."""
    headline = await served.runtime.outbox.client.chat_postMessage(channel=ANNOUNCE, text="r-1: restart")
    verdict_ts = "1700000000.000200"
    url = served.fake.response_url(channel=ANNOUNCE)
    payload = block_action("pitstop:show_log:0", served.job, response_url=url, channel=ANNOUNCE)
    payload["message"] = {"ts": verdict_ts, "thread_ts": headline["ts"], "text": "EXITED"}
    payload["container"]["is_ephemeral"] = False
    status, _, _ = await served.post(form_body({"payload": json.dumps(payload)}))
    assert status == 200
    (answer,) = await served.fake.wait_for("response_url")
    assert answer.args["thread_ts"] == headline["ts"] and answer.args["response_type"] == "in_channel"
    assert len(served.fake.thread(ANNOUNCE, headline["ts"])) == 1


# --- 8. an expired confirmation is told privately, its prompt replaced --------------------------------------


async def test_8_expired_confirmation_replaces_the_prompt_privately(build: MakeStack) -> None:
    """Unanswered, a confirmation prompt is replaced (no buttons) through its response_url; nothing is posted in the channel."""
    served = await build(confirm=True)
    served.runtime.dispatcher.confirm_window = 0.5
    url = served.fake.response_url()
    await served.command(f"restart {served.job}", response_url=url)  # acked empty, answered after
    prompt, replaced = await served.answered(url, 2)
    assert any(b["type"] == "actions" for b in prompt["blocks"])
    assert replaced["replace_original"] is True and replaced["response_type"] == "ephemeral"
    assert replaced["text"].startswith(confirm_expired(f"restart {served.job}", 0.5)[:20])
    assert not any(b["type"] == "actions" for b in replaced["blocks"])
    assert await served.fake.calls("chat.postMessage") == []


# --- 9. the all-jobs digest uploads each job's chart ---------------------------------------------------------


async def test_9_all_jobs_digest_uploads_every_jobs_chart(fake_slack: FakeSlack, tmp_path: Path) -> None:
    """A digest of two jobs posts the heading, each job's digest in its thread, and both charts."""
    outbox = _outbox(fake_slack)
    follow = tuple(Reply(title=f"digest job{i}", chart=str(_png(tmp_path, f"job{i}.png"))) for i in (1, 2))
    await outbox.post(Reply(title="digest of 2 jobs", follow_ups=follow), ANNOUNCE)
    done = await fake_slack.wait_for("files.completeUploadExternal", count=2)
    head = fake_slack.posted_to(ANNOUNCE)[0]
    assert {c.args["thread_ts"] for c in done} == {head["ts"]}
    assert {fake_slack.uploads[c.args["files"][0]["id"]]["filename"] for c in done} == {
        "job1.png",
        "job2.png",
    }


# --- 10. people appear as people ------------------------------------------------------------------------------


async def test_10_people_in_tables_and_titles_read_as_names(fake_slack: FakeSlack) -> None:
    """A history table and a title naming <@U…> show the person's name (users.info, cached), never <@U…> text."""
    outbox = _outbox(fake_slack)
    reply = Reply(
        title="restart by <@U0OPERATOR1>", tables=(Table(("run", "who"), (("r-1", "<@U0OPERATOR1>"),)),)
    )
    await outbox.post(reply, ANNOUNCE)
    await outbox.post(reply, ANNOUNCE)
    texts = "\n".join(_texts(m) for m in fake_slack.posted_to(ANNOUNCE))
    assert "@u0operator1" in texts and "U0OPERATOR1" not in texts
    assert len(await fake_slack.calls("users.info")) == 1  # cached


# --- 11. no empty text, no broken fence, no ping from job output ---------------------------------------------


async def test_11_empty_reply_and_hostile_log_are_delivered_harmlessly(fake_slack: FakeSlack) -> None:
    """An empty reply still has text; a log with ``` and pings keeps its fence and pings nobody; so do causes from a log."""
    outbox = _outbox(fake_slack)
    await outbox.post(Reply(title="", lines=("", " ")), ANNOUNCE)
    hostile = "step 1\n```\n<!channel> <!here> <@U0VICTIM> <!subteam^S0ONCALL> boom\n```"
    await outbox.post(
        Reply(
            title="dflash died",
            status=Status.ERROR,
            lines=(f"detected cause: {hostile.splitlines()[2]}",),
            log=hostile,
        ),
        ANNOUNCE,
    )
    assert await fake_slack.calls("chat.postMessage", ok=False) == []
    assert fake_slack.warnings == []
    empty, died = fake_slack.posted_to(ANNOUNCE)
    assert str(empty["text"]).strip() and validate_blocks(empty["blocks"]) == []
    texts = blocks.block_texts(died["blocks"])  # type: ignore[arg-type]
    joined = "\n".join(texts) + str(died["text"])
    for ping in ("<!channel>", "<!here>", "<@U0VICTIM>", "<!subteam^"):
        assert ping not in joined
    fenced = next(t for t in texts if t.startswith("```"))
    assert fenced.endswith("```") and fenced[3:-3].count("```") == 0


# --- 12. a quiet App Home --------------------------------------------------------------------------------------


async def test_12_app_home_opens_reuse_the_listing_and_write_one_audit_row(served: Stack) -> None:
    """Three App Home opens publish three views from one status listing: one audit row, not one per open."""
    for i in range(3):
        event = {"type": "app_home_opened", "user": "U0OPERATOR1", "channel": "D0DM", "tab": "home"}
        assert await served.event(event, event_id=f"EvHOME{i}") == 200
    await served.fake.wait_for("views.publish", count=3)
    audit = await served.runtime.ctx.redis.client.xrange(keys.audit(served.runtime.ctx.redis.prefix))
    assert len(audit) == 1


async def test_12_app_home_of_someone_without_a_role_writes_no_audit_row(served: Stack) -> None:
    """Opening the App Home without a role shows a line saying so, probes nothing and audits nothing."""
    surface = served.runtime.surface
    surface.config = surface.config.model_copy(update={"auth": AuthSettings(viewers=["U0SOMEONEELSE"])})
    for i in range(2):
        event = {"type": "app_home_opened", "user": "U0OPERATOR1", "channel": "D0DM", "tab": "home"}
        assert await served.event(event, event_id=f"EvNOROLE{i}") == 200
    published = await served.fake.wait_for("views.publish", count=2)
    assert slack_home_no_role() in "\n".join(blocks.block_texts(published[-1].args["view"]["blocks"]))
    assert await served.runtime.ctx.redis.client.xrange(keys.audit(served.runtime.ctx.redis.prefix)) == []


def test_12_manifest_scopes_are_all_used() -> None:
    """The manifest no longer asks for im:read; users:read and im:write are used (names, DMs)."""
    manifest = (ROOT / "slack-manifest.yml").read_text()
    assert "im:read" not in manifest
    source = (ROOT / "bot" / "slack" / "people.py").read_text() + (
        ROOT / "bot" / "slack" / "outbox.py"
    ).read_text()
    assert "users_info" in source and "conversations_open" in source
