"""The two-person rule through Bolt and the strict Slack stand-in, on real parts (Redis, SSH, a real
job): the request's message with diffstat, hash and the patch attached as a file; a viewer's click
refused privately; the requester's own click refused; a second person's click runs the restart with
the approved hash; two replicas' simultaneous clicks run it once; break glass announced."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest

from bot.runtime.serve import HttpServer, SlackRuntime, http_app, open_runtime, start_http
from bot.slack import blocks
from pipeline.config import ApprovalSettings, Config
from pipeline.state.audit import Actor
from pipeline.verdict import Verdict
from tests.fixtures.slack import (
    ANNOUNCE,
    BOT_TOKEN,
    SIGNING_SECRET,
    FakeSlack,
    block_action,
    form_body,
    kill_matching,
    sign,
    slack_config,
    slash_command,
    validate_blocks,
)
from tests.fixtures.ssh import InProcessHost, JobFactory, JobSetup
from tests.support_handlers import wait_until
from tests.test_restart import TOPK_DIFF

ADMIN, SECOND, OPERATOR, VIEWER = "U0ADMIN0001", "U0ADMIN0002", "U0OPERATOR1", "U0VIEWER001"
SHA = hashlib.sha256(TOPK_DIFF.encode()).hexdigest()


@dataclass
class Replica:
    """One ``pitstop serve`` (HTTP) on a free port."""

    runtime: SlackRuntime
    server: HttpServer


@dataclass
class Served:
    """Two replicas of Pitstop over one Redis and one Slack, and the job they share."""

    fake: FakeSlack
    replicas: list[Replica]
    setup: JobSetup
    http: aiohttp.ClientSession

    async def post(self, payload: str, replica: int = 0) -> int:
        """A signed request to one replica's /slack/events; its HTTP status."""
        url = f"{self.replicas[replica].server.url}/slack/events"
        headers = {"Content-Type": "application/x-www-form-urlencoded", **sign(SIGNING_SECRET, payload)}
        async with self.http.post(url, data=payload.encode(), headers=headers) as resp:
            return resp.status

    async def command(self, text: str, user: str) -> dict[str, Any]:
        """A slash command's answer on its response_url."""
        url = self.fake.response_url()
        assert await self.post(form_body(slash_command(text, user=user, response_url=url))) == 200
        tag = url.rsplit("/", 1)[1]
        (answer,) = await self.fake.wait_for("response_url", where=lambda c: c.path.endswith(tag))
        return answer.args

    async def click(self, action: str, value: str, user: str, replica: int = 0) -> dict[str, Any]:
        """A click on the request message's button; the private answer to it."""
        url = self.fake.response_url()
        payload = block_action(_action_id(action), value, user=user, channel=ANNOUNCE, response_url=url)
        assert await self.post(form_body({"payload": json.dumps(payload)}), replica) == 200
        tag = url.rsplit("/", 1)[1]
        (answer,) = await self.fake.wait_for("response_url", where=lambda c: c.path.endswith(tag))
        return answer.args


def _action_id(action: str) -> str:
    return f"{blocks.ACTION_PREFIX}{action}:0"


@contextlib.asynccontextmanager
async def _serve(
    fake_slack: FakeSlack, redis_config: Config, setup: JobSetup, expires: float
) -> AsyncIterator[Served]:
    rule = ApprovalSettings(actions=["restart_with_patch"], approvers=["admin"], expires=expires)
    setup = setup.with_job(approval=rule)
    config = slack_config(setup.config, redis_config, operators=(OPERATOR,), admins=(ADMIN, SECOND))
    async with contextlib.AsyncExitStack() as stack:
        stack.callback(kill_matching, setup.token)
        replicas = []
        for _ in range(2):
            runtime = await open_runtime(
                config, bot_token=BOT_TOKEN, api_url=fake_slack.api_url, signing_secret=SIGNING_SECRET
            )
            stack.push_async_callback(runtime.close, 30)
            server = await start_http(http_app(runtime.surface, runtime.health), host="127.0.0.1", port=0)
            stack.push_async_callback(server.close)
            replicas.append(Replica(runtime, server))
        http = await stack.enter_async_context(aiohttp.ClientSession())
        yield Served(fake_slack, replicas, setup, http)


@pytest.fixture
async def served(
    fake_slack: FakeSlack, redis_config: Config, ssh_server: InProcessHost, job_factory: JobFactory
) -> AsyncIterator[Served]:
    """Two replicas serving a job whose patched restarts wait for an admin's approval (15 min)."""
    async with _serve(
        fake_slack, redis_config, job_factory(ssh_server, patches={"topk": TOPK_DIFF}), 900
    ) as s:
        yield s


@pytest.fixture
async def served_briefly(
    fake_slack: FakeSlack, redis_config: Config, ssh_server: InProcessHost, job_factory: JobFactory
) -> AsyncIterator[Served]:
    """The same, with requests that expire after 1 s."""
    async with _serve(fake_slack, redis_config, job_factory(ssh_server, patches={"topk": TOPK_DIFF}), 1) as s:
        yield s


async def _request(served: Served) -> str:
    """Ask for the patched restart; its run id, once its message is in the channel."""
    answer = await served.command(f"restart {served.setup.name} with topk patch", OPERATOR)
    assert answer["response_type"] == "ephemeral" and "waits for a second person" in answer["text"]
    rid = answer["text"].split(":", 1)[0]
    await served.fake.wait_for("chat.postMessage", where=lambda c: "waiting for approval" in str(c.args))
    return rid


async def test_request_message_shows_the_patch_and_refuses_the_wrong_clicks(served: Served) -> None:
    """The channel message says 'waiting for approval' with the diffstat and hash, Approve/Deny and who
    may click; the exact patch bytes are uploaded into its thread; a viewer's click and the requester's
    own are refused privately and nothing runs."""
    rid = await _request(served)
    (post,) = await served.fake.wait_for(
        "chat.postMessage", where=lambda c: "waiting for approval" in str(c.args)
    )
    assert post.args["channel"] == ANNOUNCE and validate_blocks(post.args["blocks"]) == []
    texts = "\n".join(blocks.block_texts(post.args["blocks"]))
    assert SHA[:12] in texts and "settings.txt | +1 -1" in texts and "may approve: admins" in texts
    actions = next(b for b in post.args["blocks"] if b["type"] == "actions")
    assert [(blocks.action_of(e["action_id"]), e["value"]) for e in actions["elements"]] == [
        ("approve", rid),
        ("deny", rid),
    ]
    await served.fake.wait_for("files.completeUploadExternal")
    upload = next(u for u in served.fake.uploads.values() if u.get("complete"))
    assert upload["data"] == TOPK_DIFF.encode() and upload["channel"] == ANNOUNCE
    assert upload["thread_ts"] is not None and SHA in str(upload["title"])
    viewer = await served.click("approve", rid, VIEWER)
    assert viewer["response_type"] == "ephemeral" and "may not decide" in viewer["text"]
    mine = await served.click("approve", rid, OPERATOR)
    assert "you asked for" in mine["text"]
    ctx = served.replicas[0].runtime.ctx
    assert await ctx.runs.recent(served.setup.name) == []


async def test_second_person_approves_and_two_replicas_run_it_once(served: Served) -> None:
    """Two admins click Approve at the same moment on two replicas: one run, with the approved hash
    and the signed requester and approver recorded, verified RUNNING; the other click hears it was already approved; the buttons go."""
    rid = await _request(served)
    first, second = await asyncio.gather(
        served.click("approve", rid, ADMIN, replica=0), served.click("approve", rid, SECOND, replica=1)
    )
    texts = sorted([first["text"], second["text"]])
    assert sum(t.startswith(f"queued run {rid}") for t in texts) == 1, texts
    assert sum("already approved" in t for t in texts) == 1, texts
    ctx = served.replicas[0].runtime.ctx

    async def verified() -> bool:
        runs = await ctx.runs.recent(served.setup.name)
        return bool(runs) and runs[0].verdict is not None

    await wait_until(verified, timeout=60)
    (run,) = await ctx.runs.recent(served.setup.name)
    assert run.id == rid and run.verdict is Verdict.RUNNING and run.approved_patches == {"topk": SHA}
    assert run.approved_by in (ADMIN, SECOND) and run.requested_by == OPERATOR and run.patches == ["topk"]
    # who acted is the signed user, through Slack: the slash command's, then the button's
    assert run.actor == Actor(user=OPERATOR, surface="slack")
    assert run.approver == Actor(user=run.approved_by, surface="action")
    assert "topk = 8" in (served.setup.workdir / "settings.txt").read_text()
    updates = await served.fake.calls("chat.update")
    assert any(
        "approved by" in str(u.args) and "actions" not in json.dumps(u.args.get("blocks")) for u in updates
    )


async def test_break_glass_is_announced(served: Served) -> None:
    """An admin's `restart JOB --break-glass "reason"` runs without approval and says so in the channel."""
    answer = await served.command(
        f'restart {served.setup.name} with topk patch --break-glass "NCCL hang"', ADMIN
    )
    assert answer["text"].startswith("queued run")
    # the announcement (the run's own message mentions the break glass too)
    announced = await served.fake.wait_for(
        "chat.postMessage", where=lambda c: str(c.args.get("text", "")).startswith("break glass:")
    )
    (said,) = announced
    assert said.args["channel"] == ANNOUNCE and "NCCL hang" in str(said.args)
    refused = await served.command(f'restart {served.setup.name} --break-glass "me too"', OPERATOR)
    assert refused["response_type"] == "ephemeral" and "admin" in refused["text"]


async def test_an_expired_request_loses_its_buttons(served_briefly: Served) -> None:
    """Nobody decides within `expires`: the message is updated to say it expired, without buttons, and a
    late click on Approve is answered privately and runs nothing."""
    served = served_briefly
    rid = await _request(served)

    def expired(call: Any) -> bool:
        return "expired after" in str(call.args) and '"actions"' not in json.dumps(call.args.get("blocks"))

    await served.fake.wait_for("chat.update", where=expired, timeout=30)
    late = await served.click("approve", rid, ADMIN)
    assert late["response_type"] == "ephemeral" and "already expired" in late["text"]
    assert await served.replicas[0].runtime.ctx.runs.recent(served.setup.name) == []


async def test_patch_edited_after_approval_stops_at_preflight_touching_nothing(served: Served) -> None:
    """The job runs; a patched restart is asked, the patch file is edited, then approved: the run stops at
    pre-flight ("patch changed since approval"), the old process still runs and the workdir is unchanged."""
    ctx = served.replicas[0].runtime.ctx
    started = await served.command(f"start {served.setup.name}", OPERATOR)
    assert started["text"].startswith("queued run r-1")

    async def decided(run_id: str) -> bool:
        return (await ctx.runs.get(run_id)).verdict is not None

    await wait_until(lambda: decided("r-1"), timeout=60)
    old = await ctx.runs.get("r-1")
    assert old.verdict is Verdict.RUNNING and old.pid is not None
    rid = await _request(served)
    patch = served.setup.job.patches["topk"]
    patch.write_text(TOPK_DIFF.replace("topk = 8", "topk = 64"))
    assert (await served.click("approve", rid, ADMIN))["text"].startswith(f"queued run {rid}")
    await wait_until(lambda: decided(rid), timeout=60)
    run = await ctx.runs.get(rid)
    assert run.verdict is Verdict.PREFLIGHT_FAILED and run.verdict_line is not None
    assert "patch changed since approval" in run.verdict_line and SHA[:12] in run.verdict_line
    assert [s.step.value for s in run.steps] == ["preflight"]
    assert (served.setup.workdir / "settings.txt").read_text() == "topk = 1\nlr = 0.001\n"
    os.kill(old.pid, 0)  # the old run was never signalled: still alive
