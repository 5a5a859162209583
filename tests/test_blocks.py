"""Block Kit rendering: every reply fits Slack's limits, visibly truncated, escaped, with a fallback text."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from bot.slack import blocks
from bot.text import slack_rows_omitted
from handlers.reply import Button, Reply, Status, StepLine, Table
from tests.fixtures.slack import MAX_SECTION_TEXT, validate_blocks


def _section_texts(bs: list[blocks.Block]) -> list[str]:
    return [b["text"]["text"] for b in bs if b["type"] == "section" and "text" in b]


def _jobs_table(n: int) -> Table:
    return Table(
        headers=("job", "state", "pid", "uptime", "last restart", "by"),
        rows=tuple(
            (f"job-{i:03d}", "RUNNING", str(40000 + i), "3 h 12 m", f"r-{i} 2 h ago", "U0OPERATOR1")
            for i in range(n)
        ),
    )


def test_long_log_keeps_its_tail_behind_a_visible_marker() -> None:
    """A 6,000-character log is cut to one section under 3,000 characters, keeping the end and saying how much was left out."""
    log = "".join(f"step {i:05d} loss 0.{i:04d} tokens/s 1412\n" for i in range(200))
    assert len(log) > 6000
    reply = Reply(title="logs dflash", log=log, log_title="last 200 lines of /w/train.log")
    out = blocks.reply_blocks(reply)
    assert validate_blocks(out) == []
    log_section = next(t for t in _section_texts(out) if t.startswith("```"))
    assert len(log_section) <= MAX_SECTION_TEXT
    assert "step 00199 loss" in log_section  # the tail survives
    assert "step 00000 loss" not in log_section
    marker = log_section.splitlines()[1]
    assert marker.startswith("… (") and marker.endswith("earlier characters omitted)")
    omitted = int(marker.removeprefix("… (").split(" ")[0].replace(",", ""))
    kept = log_section.split("\n", 2)[2].removesuffix("\n```")
    assert omitted + len(kept) == len(log.rstrip("\n"))


def test_listing_of_80_jobs_fits_and_shows_every_job() -> None:
    """An 80-job status table is split over sections within the limits and names every job."""
    reply = Reply(title="status: 80 jobs", tables=(_jobs_table(80),))
    out = blocks.reply_blocks(reply)
    assert validate_blocks(out) == []
    assert len(out) <= blocks.MAX_BLOCKS
    text = "\n".join(_section_texts(out))
    for i in range(80):
        assert f"job-{i:03d}" in text


def test_oversized_reply_is_cut_to_one_message_keeping_title_and_buttons() -> None:
    """A reply needing far more than one message (50 blocks, 12,000 characters) keeps its title and buttons and says how much was omitted."""
    reply = Reply(
        title="a very large reply",
        status=Status.WARNING,
        lines=tuple("x" * 2500 for _ in range(120)),
        tables=tuple(_jobs_table(400) for _ in range(5)),
        buttons=(Button("Confirm", "confirm", "p-1", "primary"), Button("Cancel", "cancel", "p-1", "danger")),
    )
    out = blocks.reply_blocks(reply)
    assert validate_blocks(out) == []
    assert len(out) <= blocks.MAX_BLOCKS and blocks.block_chars(out) <= blocks.MAX_MESSAGE_CHARS
    assert "a very large reply" in out[0]["text"]["text"]
    assert out[-1]["type"] == "actions"
    assert [blocks.action_of(e["action_id"]) for e in out[-1]["elements"]] == ["confirm", "cancel"]
    assert any("more sections omitted" in t for t in blocks.block_texts(out))


def test_huge_table_is_cut_with_a_row_count() -> None:
    """A table too large for its share of the message ends with how many rows were left out."""
    reply = Reply(title="status", tables=(_jobs_table(2000),))
    out = blocks.reply_blocks(reply)
    assert validate_blocks(out) == []
    texts = blocks.block_texts(out)
    marker = next(t for t in texts if "more rows omitted" in t)
    shown = sum(t.count("job-") for t in _section_texts(out))
    assert marker == slack_rows_omitted(2000 - shown)


def test_text_is_escaped_for_mrkdwn() -> None:
    """Text from a job or a user cannot become a broadcast, a ping or a link; people read as names, channels stay links."""
    reply = Reply(
        title="<!channel> & co, by <@U0OPERATOR1> in <#C0ANNOUNCE>",
        lines=("see <http://evil|here>", "ping <!subteam^S0ONCALL>", "cc <!here> <@U0X|maya>"),
        log="<@U123> boom",
        tables=(Table(("by",), (("<@U0OPERATOR1>",),)),),
    )
    texts = "\n".join(blocks.block_texts(blocks.reply_blocks(reply, names={"U0OPERATOR1": "ops"})))
    assert "<!" not in texts and "<@" not in texts
    assert "@channel &amp; co, by @ops in <#C0ANNOUNCE>" in texts and "ping @S0ONCALL" in texts
    assert "cc @here @maya" in texts
    assert "<http" not in texts and "&lt;http://evil|here&gt;" in texts
    assert "&lt;@U123&gt; boom" in texts  # inside the log everything is literal
    assert "\n@ops\n" in texts  # and a table shows the person's name
    assert blocks.plain("by <@U1> in <#C2|ops> for <!subteam^S3>") == "by @U1 in #ops for @S3"


def test_every_message_has_a_fallback_text_within_limits() -> None:
    """The plain-text fallback carries the title and steps and stays under 3,000 characters."""
    reply = Reply(
        title="restart dflash (r-2)",
        steps=(StepLine("stop", "ok", 2.1, "8 processes stopped"), StepLine("launch", "running")),
        lines=tuple("y" * 1000 for _ in range(10)),
    )
    payload = blocks.message(reply)
    assert payload["text"].startswith("restart dflash (r-2)\n✓ stop 2.1 s - 8 processes stopped\n… launch")
    assert len(payload["text"]) <= blocks.MAX_FALLBACK
    assert "more characters omitted" in payload["text"]


def test_steps_fields_buttons_and_follow_ups_render() -> None:
    """Steps show ✓/✗ with durations, fields pair up, buttons route back, follow-ups follow a divider."""
    reply = Reply(
        title="restart dflash",
        status=Status.ERROR,
        steps=(StepLine("stop", "ok", 2.1), StepLine("launch", "failed", 0.4, "exit 3")),
        fields=tuple((f"k{i}", f"v{i}") for i in range(13)),
        buttons=(Button("Show log", "show_log", "dflash"),),
        follow_ups=(Reply(title="evidence", log="Traceback (most recent call last)"),),
    )
    out = blocks.reply_blocks(reply)
    assert validate_blocks(out) == []
    texts = blocks.block_texts(out)
    assert out[0]["text"]["text"] == ":x: *restart dflash*"
    assert "✓ stop 2.1 s\n✗ launch 0.4 s - exit 3" in texts
    assert sum(1 for b in out if b["type"] == "section" and "fields" in b) == 2
    assert any(b["type"] == "divider" for b in out)
    assert "*evidence*" in "\n".join(texts)
    button = out[-1]["elements"][0]
    assert blocks.action_of(button["action_id"]) == "show_log" and button["value"] == "dflash"
    assert not any(b["type"] == "divider" for b in blocks.reply_blocks(reply, follow_ups=False))


def test_home_view_fits_100_blocks() -> None:
    """The App Home view is a home view of at most 100 valid blocks."""
    reply = Reply(title="status", tables=tuple(_jobs_table(200) for _ in range(20)))
    view = blocks.home_view(reply, "updated now")
    assert view["type"] == "home"
    assert len(view["blocks"]) <= blocks.MAX_HOME_BLOCKS
    assert validate_blocks(view["blocks"], blocks.MAX_HOME_BLOCKS) == []
    json.dumps(view)


@settings(max_examples=200, deadline=None)
@given(
    st.text(alphabet=st.sampled_from("ab<&>\n é"), max_size=5000), st.integers(min_value=80, max_value=3000)
)
def test_keep_tail_always_fits(text: str, limit: int) -> None:
    """Whatever the text, the cut log fits its limit and, when cut, starts with the marker."""
    out = blocks.keep_tail(text, limit, wrap=("```\n", "\n```"))
    assert len(out) + 8 <= limit
    if out != blocks.escape(text):
        assert out.startswith("… (")


@settings(max_examples=200, deadline=None)
@given(
    st.text(alphabet=st.sampled_from("ab<&>\n é"), max_size=5000), st.integers(min_value=60, max_value=3000)
)
def test_keep_head_always_fits(text: str, limit: int) -> None:
    """Whatever the text, the cut text fits its limit and, when cut, ends with the marker."""
    out = blocks.keep_head(text, limit)
    assert len(out) <= limit
    if out != blocks.escape(text):
        assert out.endswith("more characters omitted)")
