"""Block Kit rendering of a :class:`~handlers.reply.Reply`, always within Slack's limits.

Slack refuses (``invalid_blocks``) a message with more than 50 blocks or a section text over
3,000 characters, and a ``text`` over 40,000 (``msg_too_long``).  Every payload built here
fits: long logs keep their *tail* behind a visible marker (``… (2,345 earlier characters
omitted)``), long tables and texts are split over several sections, and when a reply still
needs more than 50 blocks the middle is cut with a marker, keeping the title and the buttons.
Every message carries a plain-text fallback ``text`` (notifications, screen readers).

User-visible text is escaped for mrkdwn (``&``, ``<``, ``>``) so nothing a job prints can
become a mention or a link.
"""

from __future__ import annotations

import re
from typing import Any

from handlers.reply import Button, Reply, Status, Table, format_table
from pipeline import messages

MAX_BLOCKS = 50  #: blocks per message (chat.postMessage, chat.update, response_url)
MAX_HOME_BLOCKS = 100  #: blocks per App Home view
MAX_SECTION_TEXT = 3000  #: characters per section text
MAX_FIELD_TEXT = 2000  #: characters per section field
MAX_FIELDS = 10  #: fields per section
MAX_BUTTON_TEXT = 75  #: characters of a button label
MAX_BUTTON_VALUE = 2000  #: characters of a button value
MAX_ACTIONS = 25  #: elements per actions block
MAX_FALLBACK = 3000  #: our cap on the fallback ``text`` (Slack allows 40,000)
ACTION_PREFIX = "pitstop:"  #: action ids are ``pitstop:<action>:<index>``

Block = dict[str, Any]

STATUS_EMOJI = {
    Status.OK: ":white_check_mark:",
    Status.INFO: ":information_source:",
    Status.WARNING: ":warning:",
    Status.ERROR: ":x:",
}

_FENCE = "```"


_REFS = re.compile(r"<(?:@[UW][A-Z0-9]+|#C[A-Z0-9]+|!subteam\^S[A-Z0-9]+)(?:\|[^<>&|]*)?>")


def escape(text: str, *, refs: bool = False) -> str:
    """``text`` with mrkdwn's control characters escaped (``&`` ``<`` ``>``).

    :param refs: keep well-formed user, channel and user-group references (``<@U…>``,
        ``<#C…>``, ``<!subteam^S…>``) that Pitstop's own wording uses; everything else —
        ``<!channel>``, links, whatever a log or a user typed — is shown literally.
    """
    if not refs:
        return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    out: list[str] = []
    last = 0
    for m in _REFS.finditer(text):
        out.append(escape(text[last : m.start()]))
        out.append(m.group(0))
        last = m.end()
    out.append(escape(text[last:]))
    return "".join(out)


def plain(text: str) -> str:
    """Pitstop's Slack references made readable outside Slack: ``<@U1>`` → ``@U1``,
    ``<#C1>`` → ``#C1``, ``<!subteam^S1>`` → ``@S1`` (the console)."""

    def name(m: re.Match[str]) -> str:
        body = m.group(0)[1:-1]
        ref, _, label = body.partition("|")
        if label:
            return ("#" if ref.startswith("#") else "@") + label
        if ref.startswith("!subteam^"):
            return "@" + ref.removeprefix("!subteam^")
        return ref

    return _REFS.sub(name, text)


def keep_tail(text: str, limit: int, *, wrap: tuple[str, str] = ("", "")) -> str:
    """The end of ``text``, escaped, so that ``wrap[0] + result + wrap[1]`` fits ``limit`` characters.

    When text is cut, the result starts with the marker of
    :func:`pipeline.messages.slack_earlier_omitted` (counted in characters of ``text``) and,
    where a line break is near, at the start of a whole line.

    :param limit: characters available, wrapper included.
    :returns: the escaped (possibly cut) text, without the wrapper.
    """
    room = limit - len(wrap[0]) - len(wrap[1])
    whole = escape(text)
    if len(whole) <= room:
        return whole
    keep = max(room - len(messages.slack_earlier_omitted(len(text))) - 1, 0)
    while True:
        tail = text[len(text) - keep :] if keep else ""
        newline = tail.find("\n", 0, 200)
        if 0 <= newline < len(tail) - 1:
            tail = tail[newline + 1 :]
        marker = messages.slack_earlier_omitted(len(text) - len(tail))
        out = f"{marker}\n{escape(tail)}" if tail else marker
        if len(out) <= room or keep == 0:
            return out[:room]
        keep = max(keep - (len(out) - room), 0)


def keep_head(text: str, limit: int, *, refs: bool = True) -> str:
    """The start of ``text``, escaped, at most ``limit`` characters, with a marker when cut.

    :param refs: keep Pitstop's user/channel/group references (see :func:`escape`).
    """
    whole = escape(text, refs=refs)
    if len(whole) <= limit:
        return whole
    keep = max(limit - len(messages.slack_later_omitted(len(text))) - 1, 0)
    while True:
        head = text[:keep]
        out = f"{escape(head, refs=refs)} {messages.slack_later_omitted(len(text) - len(head))}"
        if len(out) <= limit or keep == 0:
            return out[:limit]
        keep = max(keep - (len(out) - limit), 0)


def _section(text: str) -> Block:
    return {"type": "section", "text": {"type": "mrkdwn", "text": text}}


def _context(text: str) -> Block:
    return {"type": "context", "elements": [{"type": "mrkdwn", "text": text}]}


def _line_sections(lines: list[str], *, fence: bool = False) -> list[Block]:
    """Sections holding ``lines`` (raw text), split at line boundaries to fit the section limit."""
    wrap = (_FENCE + "\n", "\n" + _FENCE) if fence else ("", "")
    room = MAX_SECTION_TEXT - len(wrap[0]) - len(wrap[1])
    out: list[Block] = []
    chunk: list[str] = []
    size = 0
    for raw in lines:
        line = keep_head(raw, room, refs=not fence)
        if chunk and size + 1 + len(line) > room:
            out.append(_section(wrap[0] + "\n".join(chunk) + wrap[1]))
            chunk, size = [], 0
        chunk.append(line)
        size += len(line) + (1 if len(chunk) > 1 else 0)
    if chunk:
        out.append(_section(wrap[0] + "\n".join(chunk) + wrap[1]))
    return out


def _fields(fields: tuple[tuple[str, str], ...]) -> list[Block]:
    out: list[Block] = []
    items = [
        {"type": "mrkdwn", "text": keep_head(f"*{label}*\n{value}", MAX_FIELD_TEXT)}
        for label, value in fields
    ]
    for i in range(0, len(items), MAX_FIELDS):
        out.append({"type": "section", "fields": items[i : i + MAX_FIELDS]})
    return out


def _table(table: Table, max_sections: int) -> list[Block]:
    lines = format_table(table)
    sections = _line_sections(lines, fence=True)
    if len(sections) <= max_sections:
        return sections
    # keep as many rows as fit in max_sections - 1 sections, then say how many were left out
    kept = sections[: max(max_sections - 1, 1)]
    shown = sum(b["text"]["text"].count("\n") - 1 for b in kept)  # rows + header + rule
    rows_shown = max(shown - 2, 0)
    kept.append(_context(escape(messages.slack_rows_omitted(len(table.rows) - rows_shown))))
    return kept


def _button(button: Button, index: int) -> Block:
    element: Block = {
        "type": "button",
        "text": {"type": "plain_text", "text": button.label[:MAX_BUTTON_TEXT], "emoji": True},
        "action_id": f"{ACTION_PREFIX}{button.action}:{index}",
        "value": button.value[:MAX_BUTTON_VALUE],
    }
    if button.style in ("primary", "danger"):
        element["style"] = button.style
    return element


def action_of(action_id: str) -> str:
    """The reply-model action (``confirm``, ``cancel``, ``show_log``) behind a button's action id."""
    body = action_id.removeprefix(ACTION_PREFIX)
    return body.rsplit(":", 1)[0] if re.search(r":\d+$", body) else body


def title_text(reply: Reply) -> str:
    """The title as the first section shows it (status emoji, bold, escaped)."""
    return f"{STATUS_EMOJI[reply.status]} *{keep_head(reply.title, MAX_SECTION_TEXT - 40)}*"


def _body(reply: Reply, table_sections: int) -> list[Block]:
    blocks: list[Block] = [_section(title_text(reply))]
    if reply.steps:
        blocks += _line_sections([s.text() for s in reply.steps])
    if reply.lines:
        blocks += _line_sections(list(reply.lines))
    if reply.fields:
        blocks += _fields(reply.fields)
    for table in reply.tables:
        blocks += _table(table, table_sections)
    if reply.log:
        if reply.log_title:
            blocks.append(_context(keep_head(reply.log_title, MAX_SECTION_TEXT)))
        wrap = (_FENCE + "\n", "\n" + _FENCE)
        blocks.append(
            _section(wrap[0] + keep_tail(reply.log.rstrip("\n"), MAX_SECTION_TEXT, wrap=wrap) + wrap[1])
        )
    if reply.chart:
        blocks.append(_context(escape(f"chart: {reply.chart.rsplit('/', 1)[-1]}")))
    return blocks


def fit(blocks: list[Block], limit: int = MAX_BLOCKS) -> list[Block]:
    """``blocks`` cut to ``limit``: the first ones and every actions block are kept, the middle
    is replaced by one context block saying how many were left out."""
    if len(blocks) <= limit:
        return blocks
    actions = [b for b in blocks if b.get("type") == "actions"][: limit // 2]
    others = [b for b in blocks if b.get("type") != "actions"]
    room = limit - len(actions) - 1
    kept = others[:room]
    dropped = len(others) - len(kept)
    return [*kept, _context(escape(messages.slack_blocks_omitted(dropped))), *actions]


def reply_blocks(reply: Reply, *, follow_ups: bool = True, limit: int = MAX_BLOCKS) -> list[Block]:
    """The Block Kit blocks of ``reply``, at most ``limit`` of them, every text within Slack's limits.

    :param follow_ups: also render ``reply.follow_ups`` below a divider (for surfaces with no
        thread, such as a slash command's response); the outbox posts them in the thread instead.
    :param limit: the block budget (50 for messages, 100 for the App Home view).
    :returns: blocks ready for ``chat.postMessage`` / ``chat.update`` / ``respond``.
    """
    table_sections = max(2, limit // 5)
    blocks = _body(reply, table_sections)
    if follow_ups:
        for follow in reply.follow_ups:
            blocks.append({"type": "divider"})
            blocks += _body(follow, table_sections)
    elements = [_button(b, i) for i, b in enumerate(reply.buttons)][:MAX_ACTIONS]
    if follow_ups:
        for follow in reply.follow_ups:
            start = len(elements)
            elements += [_button(b, start + i) for i, b in enumerate(follow.buttons)][: MAX_ACTIONS - start]
    if elements:
        blocks.append({"type": "actions", "elements": elements})
    return fit(blocks, limit)


def fallback_text(reply: Reply) -> str:
    """The plain-text ``text`` sent with the blocks: title, steps and lines, at most 3,000 characters."""
    parts = [reply.title, *(s.text() for s in reply.steps), *reply.lines]
    return keep_head("\n".join(parts), MAX_FALLBACK)


def message(reply: Reply, *, follow_ups: bool = True) -> dict[str, Any]:
    """``{"text": …, "blocks": […]}`` for ``reply``: the keyword arguments of a message call."""
    return {"text": fallback_text(reply), "blocks": reply_blocks(reply, follow_ups=follow_ups)}


def text_message(text: str) -> dict[str, Any]:
    """A one-section message (the "working…" ack), within the limits."""
    body = keep_head(text, MAX_SECTION_TEXT)
    return {"text": keep_head(text, MAX_FALLBACK), "blocks": [_section(body)]}


def home_view(reply: Reply, footer: str) -> dict[str, Any]:
    """The App Home view (``views.publish``): a header, ``reply`` rendered, and a footer line.

    :param reply: the job listing (state, PID, uptime, last restart and by whom).
    :param footer: a context line (when it was updated).
    """
    header: Block = {
        "type": "header",
        "text": {"type": "plain_text", "text": messages.slack_home_title()[:150], "emoji": True},
    }
    body = reply_blocks(reply, follow_ups=True, limit=MAX_HOME_BLOCKS - 2)
    return {"type": "home", "blocks": [header, *body, _context(keep_head(footer, MAX_SECTION_TEXT))]}


def block_texts(blocks: list[Block]) -> list[str]:
    """Every text in ``blocks`` (sections, fields, context elements, header, buttons), for tests
    and logs."""
    out: list[str] = []
    for block in blocks:
        if isinstance(block.get("text"), dict):
            out.append(str(block["text"].get("text", "")))
        for item in block.get("fields", []) or []:
            out.append(str(item.get("text", "")))
        for el in block.get("elements", []) or []:
            if isinstance(el.get("text"), dict):
                out.append(str(el["text"].get("text", "")))
            elif isinstance(el.get("text"), str):
                out.append(el["text"])
    return out
