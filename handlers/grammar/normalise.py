"""What a person typed, as the grammar reads it: Slack's markup and typography undone
(:func:`normalise`), then split into words (:func:`tokenise`)."""

from __future__ import annotations

import re
import unicodedata

_LEADING_MENTION = re.compile(r"^\s*<@[UW][A-Z0-9]+(?:\|[^>]*)?>[\s:,]*")
_MARKUP = re.compile(r"<([^<>]*)>")
#: smart quotes → straight; em dash (Slack's rendering of --), en dash (some clients') → --; minus → -
_SMART = str.maketrans(
    dict.fromkeys("‘’‚‛′", "'")
    | dict.fromkeys("“”„‟«»", '"')
    | dict.fromkeys("—–―", "--")
    | dict.fromkeys("−‐‑", "-")
)
_INVISIBLE = dict.fromkeys(map(ord, "\u200b\u200c\u200d\u2060\ufeff\u00ad"), None)
_FLAG_VALUE = re.compile(r"(?<!\S)(--[A-Za-z][A-Za-z0-9-]*)=")
_QUOTES = "'\"`"
_TOKEN = re.compile(r",|[^\s,]+")


def _markup(m: re.Match[str]) -> str:
    target, _, label = m.group(1).partition("|")
    if target.startswith("@"):  # <@U012AB> or <@U012AB|name>
        return target
    if target.startswith("#"):  # <#C012AB|general>
        return f"#{label}" if label else target
    if target.startswith("!subteam^"):  # <!subteam^S012AB|@oncall>
        return label if label.startswith("@") else f"@{label or target.removeprefix('!subteam^')}"
    if target.startswith("!"):  # <!here>, <!channel>, <!date^…|fallback>
        return label or f"@{target[1:]}"
    return label or target  # <https://…|label> → label, <https://…> → the URL


def normalise(text: str, *, command: str | None = None) -> str:
    """Plain words from Slack text, stripped.

    Applies, in order: drop a leading bot mention (``<@U…>``) and a leading ``command``
    (``/train``); mentions → ``@U…``, channels → ``#name``, user groups → ``@handle``, links
    → their label (else the URL); unescape ``&amp; &lt; &gt;``; Unicode NFKC; smart quotes →
    straight; em/en dashes → ``--``; invisible characters dropped; control characters and
    runs of whitespace → one space; ``--flag=value`` → ``--flag value``.
    """
    text = _LEADING_MENTION.sub("", text, count=1)
    text = _MARKUP.sub(_markup, text)
    text = text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")
    text = unicodedata.normalize("NFKC", text).translate(_SMART).translate(_INVISIBLE)
    text = "".join(" " if unicodedata.category(c)[0] in "CZ" else c for c in text)
    text = " ".join(text.split())
    if command:
        head, _, rest = text.partition(" ")
        if head.lower() == command.lower():
            text = rest
    return _FLAG_VALUE.sub(r"\1 ", text).strip()


def tokenise(text: str) -> tuple[str, ...]:
    """Words and commas of normalised text, each word stripped of surrounding quotes/backticks.

    ``"dflash"``, ```restart``` and ``'topk',`` read as ``dflash``, ``restart``, ``topk`` ``,``.
    """
    return tuple(word for tok in _TOKEN.findall(text) if (word := tok.strip(_QUOTES)))
