"""Block Kit rendering of a :class:`~handlers.reply.Reply`, always within Slack's limits (50 blocks,
3,000 characters a section, about 12,000 of block text a message): logs keep their tail behind a
marker, :func:`reply_blocks` cuts, :func:`parts` splits over messages.  Nothing a job prints or a user types
can ping anyone (:func:`escape`, :func:`humanise`) but the reply's own page.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Callable, Collection, Mapping
from typing import Any

from bot import text as words
from bot.text import SLACK_HOME_TITLE, SLACK_UNTITLED
from handlers.reply import Button, Reply, Status, Table, format_table
from handlers.text import mention

MAX_BLOCKS = 50  #: blocks per message (chat.postMessage, chat.update, response_url)
MAX_HOME_BLOCKS = 100  #: blocks per App Home view
MAX_SECTION_TEXT = 3000  #: characters per section text
MAX_FIELD_TEXT = 2000  #: characters per section field
MAX_FIELDS = 10  #: fields per section
MAX_BUTTON_TEXT = 75  #: characters of a button label
MAX_BUTTON_VALUE = 2000  #: characters of a button value
MAX_ACTIONS = 25  #: elements per actions block
MAX_FALLBACK = 3000  #: our cap on the fallback ``text`` (Slack allows 40,000)
#: block text per message: Slack refuses past about 12,000 characters in all (msg_blocks_too_long;
#: not documented, refusals reported at 11,341 and 13,202), so keep well below the lowest
MAX_MESSAGE_CHARS = 10000
MAX_PARTS = 10  #: messages one answer is split into at most (thread posts)
ACTION_PREFIX = "pitstop:"  #: action ids are ``pitstop:<action>:<index>``

Block = dict[str, Any]

STATUS_EMOJI = {
    Status.OK: ":white_check_mark:",
    Status.INFO: ":information_source:",
    Status.WARNING: ":warning:",
    Status.ERROR: ":x:",
}

_FENCE = "```"
_FENCED = (_FENCE + "\n", "\n" + _FENCE)  #: a code block's opening and closing
_REFS = re.compile(r"<(?:@[UW][A-Z0-9]+|#C[A-Z0-9]+|!subteam\^S[A-Z0-9]+|!here|!channel)(?:\|[^<>&|]*)?>")
_REFS_SPLIT = re.compile(f"({_REFS.pattern})")
_PEOPLE = re.compile(r"<(@[UW][A-Z0-9]+|!subteam\^S[A-Z0-9]+|!here|!channel|!everyone)(?:\|([^<>|]*))?>")
_TICKS = re.compile(r"`{3,}")
#: every reference :func:`plain` turns into words: people, channels, groups, broadcasts, dates
_WORDS = re.compile(r"<(?:@[UW][A-Z0-9]+|#[CG][A-Z0-9]+|![a-z]+(?:\^[^<>|]*)?)(?:\|[^<>]*)?>")


def humanise_text(
    text: str, names: Mapping[str, str] | None = None, keep: str | Collection[str] | None = None
) -> str:
    """``text`` with every person, group or broadcast reference made plain (``<@U1>`` → ``@maya``
    or ``@U1``; ``<!subteam^S1|@oncall>`` → ``@oncall``; ``<!here>`` → ``@here``), except ``keep``."""
    names = names or {}
    kept = {keep} if isinstance(keep, str) else set(keep or ())

    def plain_ref(m: re.Match[str]) -> str:
        ref, label = m.group(1), m.group(2)
        if m.group(0) in kept:
            return m.group(0)
        if ref.startswith("@"):
            return "@" + names.get(ref[1:], (label or "").lstrip("@") or ref[1:])
        if ref.startswith("!subteam^"):
            gid = ref.removeprefix("!subteam^")
            return "@" + ((label or "").lstrip("@") or names.get(gid, gid))
        return "@" + ref[1:]

    return _PEOPLE.sub(plain_ref, text)


def humanise(reply: Reply, names: Mapping[str, str] | None = None) -> Reply:
    """``reply`` with :func:`humanise_text` applied to all its text but the log; only
    ``reply.page``'s and ``reply.owners``' references stay live."""

    def words_of(one: Reply) -> Callable[[str], str]:
        keep = {mention(who) for who in (*([one.page] if one.page else []), *one.owners)}
        return lambda text: humanise_text(text, names, keep)

    return map_text(reply, words_of)


def terminal(reply: Reply, names: Mapping[str, str] | None = None) -> Reply:
    """``reply`` in words for a terminal: :func:`plain` applied to all its text but the log (what the
    job wrote stays as written); ``names``: id → name (``U…``, ``C…``), else the ids are shown."""
    return map_text(reply, lambda _: functools.partial(plain, names=names))


def map_text(reply: Reply, words_of: Callable[[Reply], Callable[[str], str]]) -> Reply:
    """``reply`` with ``words_of(reply)`` applied to every text a person reads but the log: title,
    lines, fields, table cells, step details, the log's title; its follow-ups each with their own."""
    h = words_of(reply)
    return dataclasses.replace(
        reply,
        title=h(reply.title),
        lines=tuple(h(x) for x in reply.lines),
        fields=tuple((h(k), h(v)) for k, v in reply.fields),
        tables=tuple(
            Table(tuple(h(c) for c in t.headers), tuple(tuple(h(c) for c in r) for r in t.rows))
            for t in reply.tables
        ),
        steps=tuple(dataclasses.replace(st, detail=h(st.detail)) for st in reply.steps),
        log_title=h(reply.log_title),
        follow_ups=tuple(map_text(f, words_of) for f in reply.follow_ups),
    )


def unfence(text: str) -> str:
    """``text`` for a code block: runs of 3+ backticks broken with zero-width spaces."""
    return _TICKS.sub(lambda m: "\u200b".join(m.group(0)), text)


def escape(text: str, *, refs: bool = False) -> str:
    """``text`` with mrkdwn's ``&`` ``<`` ``>`` escaped; with ``refs``, the well-formed user, channel
    and group references of Pitstop's own wording kept (never ``<!channel>``, links, a log's)."""
    if not refs:
        return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    # split on the references, kept as every odd piece
    return "".join(p if i % 2 else escape(p) for i, p in enumerate(_REFS_SPLIT.split(text)))


def plain(text: str, names: Mapping[str, str] | None = None) -> str:
    """``text`` with Slack's references made words for a terminal: ``<@U1>`` → ``@maya`` (the name in
    ``names``, else the reference's label, else ``@U1``), ``<#C1>`` → ``#ops`` or ``#C1``,
    ``<!subteam^S1|@oncall>`` → ``@oncall`` or ``@S1``, ``<!here>`` → ``@here``, ``<!date^…|fallback>``
    → its fallback."""
    names = names or {}

    def word(m: re.Match[str]) -> str:
        ref, _, label = m.group(0)[1:-1].partition("|")
        sigil, ident = ref[0], ref[1:]
        if sigil == "!":
            if not ident.startswith("subteam^") and "^" in ident:
                return label or ident.partition("^")[0]
            sigil, ident = "@", ident.removeprefix("subteam^")
        return sigil + (names.get(ident) or label.lstrip("@#") or ident)

    return _WORDS.sub(word, text)


def keep_tail(text: str, limit: int, *, wrap: tuple[str, str] = ("", "")) -> str:
    """The end of ``text``, escaped, so that ``wrap[0] + result + wrap[1]`` fits ``limit`` characters;
    when cut, behind :func:`~bot.text.slack_earlier_omitted` and from a line start where one is near."""
    room = limit - len(wrap[0]) - len(wrap[1])
    text = unfence(text) if wrap[0].startswith(_FENCE) else text
    whole = escape(text)
    if len(whole) <= room:
        return whole
    keep = max(room - len(words.slack_earlier_omitted(len(text))) - 1, 0)
    while True:
        tail = text[len(text) - keep :] if keep else ""
        newline = tail.find("\n", 0, 200)
        if 0 <= newline < len(tail) - 1:
            tail = tail[newline + 1 :]
        marker = words.slack_earlier_omitted(len(text) - len(tail))
        out = f"{marker}\n{escape(tail)}" if tail else marker
        if len(out) <= room or keep == 0:
            return out[:room]
        keep = max(keep - (len(out) - room), 0)


def keep_head(text: str, limit: int, *, refs: bool = True) -> str:
    """The start of ``text``, escaped (``refs``: see :func:`escape`), cut to ``limit`` behind a marker."""
    whole = escape(text, refs=refs)
    if len(whole) <= limit:
        return whole
    keep = max(limit - len(words.slack_later_omitted(len(text))) - 1, 0)
    while True:
        head = text[:keep]
        out = f"{escape(head, refs=refs)} {words.slack_later_omitted(len(text) - len(head))}"
        if len(out) <= limit or keep == 0:
            return out[:limit]
        keep = max(keep - (len(out) - limit), 0)


def _section(text: str) -> Block:
    return {"type": "section", "text": {"type": "mrkdwn", "text": text}}


def _context(text: str) -> Block:
    return {"type": "context", "elements": [{"type": "mrkdwn", "text": text}]}


def _line_sections(lines: list[str], *, fence: bool = False) -> list[Block]:
    wrap = _FENCED if fence else ("", "")
    room = MAX_SECTION_TEXT - len(wrap[0]) - len(wrap[1])
    chunks: list[list[str]] = []
    size = 0  # of chunks[-1], its newlines included
    for raw in lines:
        line = keep_head(unfence(raw) if fence else raw, room, refs=not fence)
        if not chunks or size + 1 + len(line) > room:
            chunks.append([])
            size = -1
        chunks[-1].append(line)
        size += 1 + len(line)
    out = [_section(wrap[0] + "\n".join(chunk) + wrap[1]) for chunk in chunks]
    return [b for b in out if b["text"]["text"].strip()]  # Slack refuses an empty section


def _fields(fields: tuple[tuple[str, str], ...]) -> list[Block]:
    items = [
        {"type": "mrkdwn", "text": keep_head(f"*{label}*\n{value}", MAX_FIELD_TEXT)}
        for label, value in fields
    ]
    return [
        {"type": "section", "fields": items[i : i + MAX_FIELDS]} for i in range(0, len(items), MAX_FIELDS)
    ]


def _table(table: Table, max_sections: int) -> list[Block]:
    sections = _line_sections(format_table(table), fence=True)
    if len(sections) <= max_sections:
        return sections
    # keep as many rows as fit in max_sections - 1 sections, then say how many were left out
    kept = sections[: max(max_sections - 1, 1)]
    shown = sum(b["text"]["text"].count("\n") - 1 for b in kept)  # rows + header + rule
    kept.append(_context(escape(words.slack_rows_omitted(len(table.rows) - max(shown - 2, 0)))))
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


def _body(reply: Reply, table_sections: int, follow_ups: bool = False) -> list[Block]:
    """``reply``'s blocks, then each follow-up's below a divider when ``follow_ups``."""
    title = " ".join(reply.title.split()) or SLACK_UNTITLED  # Slack refuses an empty text
    blocks: list[Block] = [
        _section(f"{STATUS_EMOJI[reply.status]} *{keep_head(title, MAX_SECTION_TEXT - 40)}*")
    ]
    blocks += _line_sections([s.text() for s in reply.steps]) + _line_sections(list(reply.lines))
    blocks += _fields(reply.fields)
    for table in reply.tables:
        blocks += _table(table, table_sections)
    if reply.log:
        if reply.log_title:
            blocks.append(_context(keep_head(reply.log_title, MAX_SECTION_TEXT)))
        log = keep_tail(reply.log.rstrip("\n"), MAX_SECTION_TEXT, wrap=_FENCED)
        blocks.append(_section(_FENCED[0] + log + _FENCED[1]))
    if reply.chart:
        blocks.append(_context(escape(f"chart: {reply.chart.rsplit('/', 1)[-1]}")))
    for follow in reply.follow_ups if follow_ups else ():
        blocks += [{"type": "divider"}, *_body(follow, table_sections)]
    return blocks


def block_chars(blocks: list[Block]) -> int:
    """Characters of text in ``blocks`` (what Slack's ``msg_blocks_too_long`` counts)."""
    return sum(len(t) for t in block_texts(blocks))


def _actions(reply: Reply, follow_ups: bool) -> Block | None:
    below = reply.follow_ups if follow_ups else ()
    buttons = [*reply.buttons, *(b for follow in below for b in follow.buttons)]
    elements = [_button(b, i) for i, b in enumerate(buttons[:MAX_ACTIONS])]
    return {"type": "actions", "elements": elements} if elements else None


def parts(
    reply: Reply,
    *,
    follow_ups: bool = True,
    names: Mapping[str, str] | None = None,
    max_parts: int = MAX_PARTS,
    attached: bool = False,
    limit: int = MAX_BLOCKS,
    chars: int = MAX_MESSAGE_CHARS,
    table_sections: int = 10_000,
) -> list[dict[str, Any]]:
    """``reply`` as one or more messages (``{"text", "blocks"}``), each within ``limit`` blocks and
    ``chars`` characters of block text (Slack's limits for a message).

    Nothing is cut while ``max_parts`` messages suffice (5 for a ``response_url``): the first holds
    the title, the buttons and :func:`~bot.text.slack_continued`, each later one starts with
    :func:`~bot.text.slack_part`.  Past that the last one says how many sections were left out, or with
    ``attached`` (the caller attaches the whole answer as a file) that they are in the file; a table
    longer than ``table_sections`` sections says how many rows were left out.
    ``follow_ups`` and ``names``: as for :func:`reply_blocks`.  At least one payload.
    """
    reply = humanise(reply, names)
    body = _body(reply, table_sections, follow_ups)
    actions = _actions(reply, follow_ups)
    tail = [actions] if actions else []
    reserve = block_chars(tail) + 200  # markers
    chunks: list[list[Block]] = [[]]
    size = 0
    for block in body:
        n = block_chars([block])
        chunk = chunks[-1]
        if chunk and (len(chunk) + len(tail) + 2 > limit or size + n > chars - reserve):
            chunks.append([])
            size = 0
        chunks[-1].append(block)
        size += n
    for chunk in chunks:  # a lone divider leading a later part says nothing
        while len(chunk) > 1 and chunk[0]["type"] == "divider":
            chunk.pop(0)
    if len(chunks) > max_parts:
        dropped = sum(len(c) for c in chunks[max_parts:])
        chunks = chunks[:max_parts]
        if len(chunks[-1]) + len(tail) + 3 > limit:
            dropped += 1
            chunks[-1].pop()
        cut = words.slack_attached(dropped) if attached else words.slack_blocks_omitted(dropped)
        chunks[-1].append(_context(escape(cut)))
    total = len(chunks)
    more = [_context(escape(words.slack_continued(total - 1)))] if total > 1 else []
    out: list[dict[str, Any]] = [{"text": fallback_text(reply), "blocks": chunks[0] + more + tail}]
    for i, chunk in enumerate(chunks[1:], 2):
        label = words.slack_part(i, total, reply.title)
        head = _context(keep_head(label, MAX_SECTION_TEXT))
        out.append({"text": keep_head(label, MAX_FALLBACK), "blocks": [head, *chunk]})
    return out


def reply_blocks(
    reply: Reply, *, follow_ups: bool = True, limit: int = MAX_BLOCKS, names: Mapping[str, str] | None = None
) -> list[Block]:
    """The Block Kit blocks of ``reply`` for one message, cut to ``limit`` blocks (50 for messages,
    100 for the App Home view) and :data:`MAX_MESSAGE_CHARS` characters, what is cut said in a last
    section (:func:`parts` splits instead);
    ``follow_ups``: also ``reply.follow_ups`` below a divider; ``names``: id → name for :func:`humanise`."""
    home = limit > MAX_BLOCKS  # the App Home: no character cap, a table in a fifth of its blocks
    one = parts(
        reply,
        follow_ups=follow_ups,
        names=names,
        max_parts=1,
        limit=limit,
        chars=10**9 if home else MAX_MESSAGE_CHARS,
        table_sections=max(2, limit // 5) if home else MAX_MESSAGE_CHARS // MAX_SECTION_TEXT,
    )
    return list(one[0]["blocks"])


def fallback_text(reply: Reply) -> str:
    """The plain-text ``text`` sent with the blocks: title, steps and lines, 1 to 3,000 characters."""
    lines = [reply.title, *(s.text() for s in reply.steps), *reply.lines]
    text = "\n".join(line for line in lines if line.strip())
    return keep_head(text or SLACK_UNTITLED, MAX_FALLBACK)


def message(
    reply: Reply, *, follow_ups: bool = True, names: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """``{"text": …, "blocks": […]}`` for ``reply`` as one message, cut visibly if too long."""
    blocks = reply_blocks(reply, follow_ups=follow_ups, names=names)
    return {"text": fallback_text(humanise(reply, names)), "blocks": blocks}


def text_message(text: str) -> dict[str, Any]:
    """A one-section message, within the limits; references in ``text`` never ping."""
    text = humanise_text(text) if text.strip() else SLACK_UNTITLED
    return {"text": keep_head(text, MAX_FALLBACK), "blocks": [_section(keep_head(text, MAX_SECTION_TEXT))]}


def home_view(reply: Reply, footer: str, names: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The App Home view (``views.publish``): a header, ``reply`` (the job listing), a footer line."""
    header = {"type": "header", "text": {"type": "plain_text", "text": SLACK_HOME_TITLE[:150], "emoji": True}}
    body = reply_blocks(reply, follow_ups=True, limit=MAX_HOME_BLOCKS - 2, names=names)
    return {"type": "home", "blocks": [header, *body, _context(keep_head(footer, MAX_SECTION_TEXT))]}


def block_texts(blocks: list[Block]) -> list[str]:
    """Every text in ``blocks`` (sections, fields, context elements, header, buttons)."""

    def texts(part: Block) -> list[str]:  # a text object's text, or a field's or element's own
        text = part.get("text")
        text = text.get("text", "") if isinstance(text, dict) else text
        return [text] if isinstance(text, str) else []

    parts = [p for b in blocks for p in (b, *(b.get("fields") or []), *(b.get("elements") or []))]
    return [t for p in parts for t in texts(p)]
