"""The Slack stand-in refuses what Slack refuses: block budget, membership, scopes, response_url
uses, rate tiers, faults after storing, Socket Mode redelivery and disconnects."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from tests.fixtures.slack import (
    APP_TOKEN,
    BOT_TOKEN,
    MAX_BLOCK_CHARS,
    Channel,
    FakeSlack,
    envelope,
    manifest_scopes,
    open_app_socket,
)


def _client(fake: FakeSlack) -> AsyncWebClient:
    client = AsyncWebClient(token=BOT_TOKEN, base_url=fake.api_url)
    client.retry_handlers = []
    return client


def _section(text: str) -> dict[str, object]:
    return {"type": "section", "text": {"type": "mrkdwn", "text": text}}


async def _error(call: object) -> str:
    with pytest.raises(SlackApiError) as refused:
        await call  # type: ignore[misc]
    return str(refused.value.response["error"])


async def test_block_text_past_12000_characters_is_refused(fake_slack: FakeSlack) -> None:
    """Five full sections (15,000 characters) are refused with msg_blocks_too_long; four pass."""
    client = _client(fake_slack)
    four = [_section("x" * 2999)] * 4
    await client.chat_postMessage(channel="C0ANNOUNCE", text="ok", blocks=four)
    five = [_section("x" * 3000)] * 5
    assert 5 * 3000 > MAX_BLOCK_CHARS
    assert await _error(client.chat_postMessage(channel="C0ANNOUNCE", text="x", blocks=five)) == (
        "msg_blocks_too_long"
    )


async def test_channel_membership_archive_and_unknown(fake_slack: FakeSlack) -> None:
    """Posts need membership (public channels allow chat:write.public); files always do; archived and unknown refuse."""
    fake_slack.add_channel(Channel("C0PUBLIC", member=False))
    fake_slack.add_channel(Channel("G0PRIVATE", public=False, member=False))
    fake_slack.add_channel(Channel("C0OLD", archived=True))
    client = _client(fake_slack)
    await client.chat_postMessage(channel="C0PUBLIC", text="hi")  # chat:write.public
    assert await _error(client.chat_postMessage(channel="G0PRIVATE", text="hi")) == "not_in_channel"
    assert await _error(client.chat_postMessage(channel="C0OLD", text="hi")) == "is_archived"
    assert await _error(client.chat_postMessage(channel="C0NOSUCH", text="hi")) == "channel_not_found"
    got = await client.files_getUploadURLExternal(filename="a.txt", length=3)
    async with aiohttp.ClientSession() as http, http.post(got["upload_url"], data=b"abc") as resp:
        assert resp.status == 200
    files = [{"id": got["file_id"], "title": "a"}]
    refused = client.files_completeUploadExternal(files=files, channel_id="C0PUBLIC")
    assert await _error(refused) == "not_in_channel"
    await client.conversations_join(channel="C0PUBLIC")
    await client.files_completeUploadExternal(files=files, channel_id="C0PUBLIC")


async def test_scopes_come_from_the_manifest() -> None:
    """A method whose scope the token lacks answers missing_scope naming it; the manifest's scopes are granted."""
    assert "chat:write" in manifest_scopes()
    async with FakeSlack(scopes=frozenset({"commands"})) as fake:
        client = _client(fake)
        with pytest.raises(SlackApiError) as refused:
            await client.chat_postMessage(channel="C0ANNOUNCE", text="hi")
        assert refused.value.response["error"] == "missing_scope"
        assert refused.value.response["needed"] == "chat:write"
        auth = await client.auth_test()
        assert auth.headers.get("x-oauth-scopes") == "commands"


async def test_response_url_five_uses_in_30_minutes_and_its_options(fake_slack: FakeSlack) -> None:
    """A response_url takes 5 posts, then used_url; after 30 minutes expired_url; it replaces, deletes and threads."""
    client = _client(fake_slack)
    posted = await client.chat_postMessage(channel="C0COMMANDS", text="prompt")
    url = fake_slack.response_url(original=("C0COMMANDS", posted["ts"]))
    async with aiohttp.ClientSession() as http:

        async def send(body: dict[str, object]) -> tuple[int, str]:
            async with http.post(url, json=body) as resp:
                return resp.status, await resp.text()

        assert await send({"text": "replaced", "replace_original": True}) == (200, "ok")
        assert fake_slack.message("C0COMMANDS", posted["ts"])["text"] == "replaced"
        assert await send(
            {"text": "in thread", "response_type": "in_channel", "thread_ts": posted["ts"]}
        ) == (
            200,
            "ok",
        )
        assert [m["text"] for m in fake_slack.thread("C0COMMANDS", posted["ts"])] == ["in thread"]
        assert await send({"text": "only you"}) == (200, "ok")
        assert await send({"text": ""}) == (400, "no_text")
        assert await send({"delete_original": True}) == (200, "ok")
        assert ("C0COMMANDS", posted["ts"]) in fake_slack.deleted
        assert await send({"text": "fifth"}) == (200, "ok")
        assert await send({"text": "sixth"}) == (404, "used_url")
        late = fake_slack.response_url()
        fake_slack.advance(30 * 60 + 1)
        async with http.post(late, json={"text": "late"}) as resp:
            assert (resp.status, await resp.text()) == (404, "expired_url")


async def test_post_message_is_limited_per_channel_with_retry_after(fake_slack: FakeSlack) -> None:
    """A burst of posts to one channel gets 429 with Retry-After; another channel is not held back."""
    client = _client(fake_slack)
    statuses = []
    for i in range(8):
        try:
            await client.chat_postMessage(channel="C0ANNOUNCE", text=f"post {i}")
            statuses.append(200)
        except SlackApiError as exc:
            statuses.append(exc.response.status_code)
            assert int(exc.response.headers["retry-after"]) >= 1
    assert 429 in statuses and statuses[0] == 200
    await client.chat_postMessage(channel="C0OTHER", text="elsewhere")


async def test_injected_5xx_and_reset_happen_after_storing(fake_slack: FakeSlack) -> None:
    """fail_next stores the message and then answers 503 or drops the connection."""
    client = _client(fake_slack)
    fake_slack.fail_next("chat.postMessage", status=503)
    with pytest.raises(SlackApiError):
        await client.chat_postMessage(channel="C0ANNOUNCE", text="one")
    fake_slack.fail_next("chat.postMessage", reset=True)
    with pytest.raises(aiohttp.ClientError):
        await client.chat_postMessage(channel="C0ANNOUNCE", text="two")
    assert [m["text"] for m in fake_slack.posted_to("C0ANNOUNCE")] == ["one", "two"]


async def test_held_calls_wait_untouched_until_released_in_order(fake_slack: FakeSlack) -> None:
    """While held, posts are neither answered, recorded nor stored; released, they go on in the order they came."""
    client = _client(fake_slack)
    fake_slack.hold("chat.postMessage")
    posts = []
    for i in range(3):
        posts.append(asyncio.create_task(client.chat_postMessage(channel="C0ANNOUNCE", text=f"post {i}")))
        await fake_slack.wait_held("chat.postMessage", i + 1)
    assert await fake_slack.calls("chat.postMessage") == [] and fake_slack.posted_to("C0ANNOUNCE") == []
    assert not any(p.done() for p in posts)
    fake_slack.release()
    await asyncio.wait_for(asyncio.gather(*posts), 10)
    assert [m["text"] for m in fake_slack.posted_to("C0ANNOUNCE")] == ["post 0", "post 1", "post 2"]
    assert fake_slack.holding["chat.postMessage"] == 0


async def test_unacked_event_is_redelivered_with_retry_attempt() -> None:
    """An events_api envelope not acked in time comes again with retry_attempt 1 and reason timeout; an acked one does not."""
    async with FakeSlack(ack_timeout=0.2) as fake, aiohttp.ClientSession() as http:
        ws = await open_app_socket(http, fake)
        await fake.socket_send(envelope("events_api", {"event": {"type": "app_mention"}}))
        first = await ws.receive_json(timeout=5)
        again = await ws.receive_json(timeout=5)
        assert again["retry_attempt"] == 1 and again["retry_reason"] == "timeout"
        assert again["envelope_id"] != first["envelope_id"] and again["payload"] == first["payload"]
        await ws.send_json({"envelope_id": again["envelope_id"]})
        await fake.wait_ack(again["envelope_id"])
        with pytest.raises(TimeoutError):
            await ws.receive_json(timeout=0.6)
        await ws.close()


async def test_disconnect_warning_refresh_and_link_disabled(fake_slack: FakeSlack) -> None:
    """warning only warns; refresh_requested closes the old socket once a new one is open; link_disabled closes it for good."""
    async with aiohttp.ClientSession() as http:
        old = await open_app_socket(http, fake_slack)
        await fake_slack.socket_disconnect("warning")
        assert (await old.receive_json(timeout=5))["reason"] == "warning"
        await fake_slack.socket_disconnect("refresh_requested")
        assert (await old.receive_json(timeout=5))["reason"] == "refresh_requested"
        new = await open_app_socket(http, fake_slack)
        closing = await old.receive(timeout=5)
        assert closing.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.CLOSING)
        await fake_slack.socket_disconnect("link_disabled")
        assert (await new.receive_json(timeout=5))["reason"] == "link_disabled"
        async with http.post(
            f"{fake_slack.api_url}apps.connections.open", headers={"Authorization": f"Bearer {APP_TOKEN}"}
        ) as r:
            assert (await r.json())["ok"] is False
        await new.close()
        await old.close()


async def test_restricted_ekm_and_dead_tokens_are_refused(fake_slack: FakeSlack) -> None:
    """Read-only, admins-only and thread-only channels answer restricted_action, EKM ekm_access_denied, a dead token its own error."""
    client = _client(fake_slack)
    fake_slack.add_channel(Channel("C0RO", read_only=True))
    fake_slack.add_channel(Channel("C0THREADS", thread_only=True))
    fake_slack.add_channel(Channel("C0EKM", ekm=True))
    fake_slack.add_channel(Channel("C0ADMINS", admins_only=True))
    assert await _error(client.chat_postMessage(channel="C0ADMINS", text="x")) == "restricted_action"
    admins = (await client.conversations_info(channel="C0ADMINS"))["channel"]
    assert admins["properties"]["posting_restricted_to"] == {"type": ["admin"]}
    assert await _error(client.chat_postMessage(channel="C0RO", text="x")) == "restricted_action"
    assert await _error(client.chat_postMessage(channel="C0THREADS", text="x")) == "restricted_action"
    await client.chat_postMessage(channel="C0THREADS", text="in a thread", thread_ts="1.0")
    assert await _error(client.chat_postMessage(channel="C0EKM", text="x")) == "ekm_access_denied"
    info = (await client.conversations_info(channel="C0RO"))["channel"]
    assert info["is_read_only"] is True and info["is_thread_only"] is False
    for error in ("token_revoked", "token_expired", "account_inactive"):
        fake_slack.token_error = error
        assert await _error(client.chat_postMessage(channel="C0ANNOUNCE", text="x")) == error
    assert [m["text"] for m in fake_slack.posted_to("C0THREADS")] == ["in a thread"]


async def test_http_200_fatal_error_comes_after_storing(fake_slack: FakeSlack) -> None:
    """fail_next(error=…) stores the message, then answers HTTP 200 with ok false and that error."""
    client = _client(fake_slack)
    fake_slack.fail_next("chat.postMessage", error="fatal_error")
    assert await _error(client.chat_postMessage(channel="C0ANNOUNCE", text="one")) == "fatal_error"
    (call,) = await fake_slack.calls("chat.postMessage")
    assert call.status == 200 and [m["text"] for m in fake_slack.posted_to("C0ANNOUNCE")] == ["one"]


async def test_messages_show_late_in_history_and_pages_have_cursors(fake_slack: FakeSlack) -> None:
    """A stored message is listed only visible_after s later; replies honour oldest and page by cursor."""
    client = _client(fake_slack)
    fake_slack.rate_limits = False
    fake_slack.visible_after = 30
    ts = (await client.chat_postMessage(channel="C0ANNOUNCE", text="late"))["ts"]
    assert (await client.conversations_history(channel="C0ANNOUNCE"))["messages"] == []
    fake_slack.advance(30)
    assert [m["text"] for m in (await client.conversations_history(channel="C0ANNOUNCE"))["messages"]] == [
        "late"
    ]
    fake_slack.visible_after = 0
    for i in range(5):
        await client.chat_postMessage(channel="C0ANNOUNCE", text=f"r{i}", thread_ts=ts)
    first = await client.conversations_replies(channel="C0ANNOUNCE", ts=ts, limit=3)
    assert [m["text"] for m in first["messages"]] == ["late", "r0", "r1"] and first["has_more"]
    cursor = first["response_metadata"]["next_cursor"]
    rest = await client.conversations_replies(channel="C0ANNOUNCE", ts=ts, limit=3, cursor=cursor)
    assert [m["text"] for m in rest["messages"]] == ["r2", "r3", "r4"] and not rest["has_more"]
    r3 = fake_slack.posted_to("C0ANNOUNCE")[4]["ts"]
    newer = await client.conversations_replies(channel="C0ANNOUNCE", ts=ts, oldest=r3)
    assert [m["text"] for m in newer["messages"]] == ["late", "r3", "r4"]


async def test_late_command_ack_is_an_operation_timeout_and_sockets_are_capped() -> None:
    """A slash command acked after the ack timeout is an operation_timeout; an 11th socket is told too_many_websockets."""
    async with FakeSlack(ack_timeout=0.2) as fake, aiohttp.ClientSession() as http:
        ws = await open_app_socket(http, fake)
        on_time = envelope("slash_commands", {"command": "/train"})
        late = envelope("slash_commands", {"command": "/train"})
        await fake.socket_send(on_time)
        await ws.send_json({"envelope_id": on_time["envelope_id"]})
        await fake.wait_ack(on_time["envelope_id"])
        await fake.socket_send(late)
        with pytest.raises(TimeoutError):
            await fake.wait_ack(late["envelope_id"], timeout=0.3)
        await ws.send_json({"envelope_id": late["envelope_id"]})
        await fake.wait_ack(late["envelope_id"])
        assert fake.operation_timeouts == [late["envelope_id"]]
        more = [await open_app_socket(http, fake) for _ in range(9)]
        async with http.post(
            f"{fake.api_url}apps.connections.open", headers={"Authorization": f"Bearer {APP_TOKEN}"}
        ) as r:
            url = (await r.json())["url"]
        eleventh = await http.ws_connect(url)
        refused = await eleventh.receive_json(timeout=5)
        assert refused == {"type": "disconnect", "reason": "too_many_websockets"}
        assert len(fake.open_sockets()) == 10
        for sock in [ws, eleventh, *more]:
            await sock.close()
