"""Typed commands: what a person asked for, checked against the config, or one clear error.

:func:`parse` turns text into a frozen :class:`Command` or raises :class:`ParseError`, never
anything else.  Jobs, hosts and patches come back in their configured spelling, numbers and
durations are bounded integers, ``on|off`` is a choice: nothing typed ever reaches a command line::

    parse("restart DFlash with topk patch", config) == Command("restart", job="dflash",
        patches=("topk",), options={"without": (), "fresh_cache": False})
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from handlers.grammar import parse as grammar
from handlers.grammar.normalise import normalise, tokenise
from handlers.grammar.parse import SLOTS, Binding, VerbSpec
from pipeline import fmt
from pipeline.config import Config
from pipeline.errors import ExitCode, PitstopError

MAX_TEXT = 500  #: characters; longer requests are refused before parsing
MAX_TOKENS = 64

OptionValue = bool | int | str | tuple[str, ...] | None


class ParseError(PitstopError):
    """Text that is not a command, with a message a person can act on (did-you-mean, usage);
    ``verb`` when the text got that far."""

    code = "parse_error"
    exit_code = ExitCode.USAGE

    def __init__(self, message: str, verb: str | None = None) -> None:
        super().__init__(message)
        self.verb = verb


@dataclass(frozen=True)
class Command:
    """A parsed, validated request; names in their configured spelling."""

    verb: str  #: canonical (``restart``, ``status`` …)
    job: str | None = None
    host: str | None = None  #: ``gpus``
    patches: tuple[str, ...] = ()  #: patch names to add (``restart … with P patch``)
    #: read-only, read through the properties below: ``without``, ``fresh_cache``, ``break_glass``
    #: (restart), ``lines`` (logs), ``count``, ``attempts`` (history), ``state``, ``for_s`` (watch),
    #: ``run`` (approve, deny, follow), ``reason`` (approve, deny), ``topic`` (help)
    options: Mapping[str, OptionValue] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "options", MappingProxyType(dict(self.options)))

    @property
    def spec(self) -> VerbSpec:
        """The verb's entry in the command table."""
        return grammar.VERBS[self.verb]

    @property
    def without(self) -> tuple[str, ...]:
        """Patches to remove (restart)."""
        value = self.options.get("without", ())
        return value if isinstance(value, tuple) else ()

    @property
    def fresh_cache(self) -> bool:
        """Clear the job's caches (restart)."""
        return self.options.get("fresh_cache") is True

    @property
    def lines(self) -> int:
        """Log lines asked for (logs)."""
        return self._int("lines") or grammar.DEFAULT_LINES

    @property
    def count(self) -> int:
        """Runs asked for (history)."""
        return self._int("count") or grammar.DEFAULT_COUNT

    @property
    def attempts(self) -> bool:
        """One row per attempt instead of per run (``history --attempts``)."""
        return self.options.get("attempts") is True

    @property
    def for_s(self) -> int | None:
        """Seconds watching stays off (watch … off for DURATION), or None."""
        return self._int("for_s")

    @property
    def state(self) -> str | None:
        """``on`` or ``off`` (watch)."""
        return self._str("state")

    @property
    def run_ref(self) -> str | None:
        """The run id a request is named by, or a run to follow (approve, deny, follow: ``r-7``), or None."""
        return self._str("run")

    @property
    def reason(self) -> str | None:
        """Free text: a denial's reason (deny), or None."""
        return self._str("reason")

    @property
    def break_glass(self) -> str | None:
        """An admin's reason for restarting without approval (``--break-glass "REASON"``), or None."""
        return self._str("break_glass")

    @property
    def topic(self) -> str | None:
        """The verb ``help`` was asked about, or None."""
        return self._str("topic")

    def _int(self, name: str) -> int | None:
        value = self.options.get(name)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    def _str(self, name: str) -> str | None:
        value = self.options.get(name)
        return value if isinstance(value, str) else None

    def to_json(self) -> dict[str, Any]:
        """The command as a JSON-ready dict (``pitstop parse``, the audit trail, confirmations)."""
        return {
            "verb": self.verb,
            "job": self.job,
            "host": self.host,
            "patches": list(self.patches),
            "options": {k: list(v) if isinstance(v, tuple) else v for k, v in self.options.items()},
        }

    def dumps(self) -> str:
        """:meth:`to_json` as compact JSON text."""
        return json.dumps(self.to_json(), separators=(",", ":"))

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Command:
        """The inverse of :meth:`to_json` (for records Pitstop itself wrote); KeyError without a verb."""
        options = {
            k: tuple(v) if isinstance(v, list) else v for k, v in dict(data.get("options", {})).items()
        }
        return cls(
            str(data["verb"]), data.get("job"), data.get("host"), tuple(data.get("patches", ())), options
        )

    def text(self) -> str:
        """The command written out canonically (``restart dflash with topk patch fresh cache``)."""
        words = [self.verb, self.job or "", self.host or ""]
        if self.verb == "restart":
            if self.patches:
                words.append("with " + patch_phrase(self.patches))
            if self.without:
                words.append("without " + patch_phrase(self.without))
            if self.fresh_cache:
                words.append("fresh cache")
            if self.break_glass is not None:
                words.append(f'--break-glass "{self.break_glass}"')
        elif self.verb in ("approve", "deny", "follow"):
            words += [self.run_ref or "", self.reason or ""]
        elif self.verb == "logs":
            words.append(str(self.lines))
        elif self.verb == "history":
            words.append(str(self.count))
            if self.attempts:
                words.append("--attempts")
        elif self.verb == "watch":
            words.append(self.state or "")
            if self.for_s:
                words.append(f"for {fmt.duration(self.for_s)}")
        elif self.topic:
            words.append(self.topic)
        return " ".join(w for w in words if w)


# --- parsing -------------------------------------------------------------------------------------


def close_names(given: str, known: Iterable[str], n: int = 3) -> list[str]:
    """At most ``n`` configured names close to ``given`` (case-insensitive), in their configured spelling."""
    by_lower = {k.lower(): k for k in known}
    return [by_lower[m] for m in difflib.get_close_matches(given.lower(), list(by_lower), n=n, cutoff=0.6)]


def _unknown(kind: str, given: str, known: Sequence[str], verb: str | None, where: str = "") -> ParseError:
    """An unknown ``kind`` (``job``, ``host``, ``command``, ``patch``) looked up ``where`` (``for
    dflash``, or empty): ``unknown job 'dflsh' — did you mean 'dflash'? (known: dflash, eagle)``."""
    suggestions = close_names(given, known)
    hint = f" — did you mean {' or '.join(repr(s) for s in suggestions)}?" if suggestions else ""
    listing = f"(known: {', '.join(known)})" if known else "(none configured)"
    at = f" {where}" if where else ""
    return ParseError(f"unknown {kind} {given!r}{at}{hint} {listing}", verb)


def _lookup(kind: str, given: str, known: Sequence[str], verb: str, where: str = "") -> str:
    for name in known:
        if name.lower() == given.lower():
            return name
    raise _unknown(kind, given, known, verb, where)


def _int(slot: str, raw: str, verb: str) -> int:
    kind, value = SLOTS[slot], int(raw)
    if not kind.low <= value <= kind.high:
        what = "lines" if slot == "lines" else "N"
        raise ParseError(f"{what} must be between {kind.low} and {kind.high}, got {value}", verb)
    return value


def parse_duration_seconds(raw: str, verb: str | None = None) -> int:
    """Whole seconds from ``90s``, ``30m``, ``2h``, ``1d`` (or a bare number of seconds);
    :class:`ParseError` if it is not a duration or lies outside 1 s … 7 d."""
    kind = SLOTS["for_s"]
    longest = fmt.duration(kind.high)
    try:
        seconds = round(fmt.parse_duration(raw))
    except ValueError:
        raise ParseError(
            f"{raw!r} is not a duration - use e.g. 90s, 30m, 2h or 1d (at most {longest})", verb
        ) from None
    if not kind.low <= seconds <= kind.high:
        raise ParseError(f"duration {raw!r} is out of range - give at least 1 s and at most {longest}", verb)
    return seconds


def _patches(raw: Sequence[str], job: str, config: Config, verb: str) -> tuple[str, ...]:
    known = list(config.jobs[job].patches)
    return tuple(dict.fromkeys(_lookup("patch", name, known, verb, f"for {job}") for name in raw))


def _convert(spec: VerbSpec, binding: Binding, config: Config) -> Command:
    verb = spec.name
    raw: dict[str, list[str]] = {}
    for name, value in binding:
        raw.setdefault(name, []).extend([value] if isinstance(value, str) else value)

    def one(name: str) -> str | None:
        values = raw.get(name)
        return values[0] if values else None

    job_raw, host_raw = one("job"), one("host")
    job = _lookup("job", job_raw, list(config.jobs), verb) if job_raw is not None else None
    host = _lookup("host", host_raw, list(config.hosts), verb) if host_raw is not None else None
    options: dict[str, OptionValue] = {}
    patches: tuple[str, ...] = ()
    if verb == "restart":
        assert job is not None
        patches = _patches(raw.get("patches", []), job, config, verb)
        without = _patches(raw.get("without", []), job, config, verb)
        both = [p for p in patches if p in without]
        if both:
            named = ", ".join(repr(p) for p in both)
            raise ParseError(f"patch {named} cannot be both added and removed", verb)
        options["without"] = without
        options["fresh_cache"] = "fresh_cache" in raw
        if "reason" in raw:
            options["break_glass"] = _reason(raw["reason"])
    elif verb in ("approve", "deny", "follow"):
        ref = one("run") or ""
        if not _RUN_REF.fullmatch(ref.lower()):
            hint = "`follow r-7` (see `history`)" if verb == "follow" else "`approve r-7` (see `pending`)"
            raise ParseError(f"{ref!r} is not a run id - give it as Pitstop wrote it, e.g. {hint}", verb)
        options["run"] = ref.lower()
        if "reason" in raw:
            options["reason"] = _reason(raw["reason"])
    elif verb in ("logs", "history"):
        slot, default = (
            ("lines", grammar.DEFAULT_LINES) if verb == "logs" else ("count", grammar.DEFAULT_COUNT)
        )
        n = one(slot)
        options[slot] = _int(slot, n, verb) if n is not None else default
        if "attempts" in raw:
            options["attempts"] = True
    elif verb == "watch":
        state = one("state")
        assert state is not None and job is not None
        options["state"] = state
        duration = one("for_s")
        if duration is not None:
            if state != "off":  # a duration only makes sense when pausing
                raise ParseError(
                    f"`for DURATION` pauses watching for a while: say `watch {job} off for 2h`", verb
                )
            options["for_s"] = parse_duration_seconds(duration, verb)
    elif verb == "help":
        topic = one("topic")
        if topic is not None:
            topic_spec = grammar.verb_spec(topic)
            if topic_spec is None:
                raise _unknown("command", topic, list(grammar.VERBS), verb)
            options["topic"] = topic_spec.name
    return Command(verb=verb, job=job, host=host, patches=patches, options=options)


_RUN_REF = re.compile(r"r-[0-9]{1,12}")


def _reason(words: Sequence[str]) -> str:
    """Free-text words as one line (``a , b`` → ``a, b``), at most 300 characters."""
    return " ".join(words).replace(" ,", ",")[:300]


def _numbers_as_names(binding: Binding) -> int:
    """How many name slots of ``binding`` hold a bare number (less likely what was meant)."""
    names = (value for name, value in binding if name in SLOTS and SLOTS[name].kind == "name")
    return sum(1 for value in names if isinstance(value, str) and value.isdigit())


def parse(text: str, config: Config) -> Command:
    """The command ``text`` (slash command text, a mention, a console line) asks for, its names
    checked against ``config``.  Slack markup is normalised first; verbs and names ignore case;
    empty text is ``help``.

    :raises ParseError: unknown verb/job/host/patch (with did-you-mean and the known names),
        arguments that fit no form of the verb (its usage line), numbers or durations out of
        bounds, or text too long to be a command.
    """
    clean = normalise(text, command=config.slack.command) if len(text) <= MAX_TEXT * 4 else text
    if len(clean) > MAX_TEXT:
        raise ParseError(parse_too_long(MAX_TEXT))
    tokens = tokenise(clean)
    if not tokens:
        return Command("help")
    spec = grammar.verb_spec(tokens[0])
    if spec is None:
        raise _unknown("command", tokens[0], list(grammar.VERBS), None)
    matches = grammar.match(spec, tokens) if len(tokens) <= MAX_TOKENS else []
    if not matches:  # its usage line(s), aligned under the first
        usage = "\n       ".join(spec.usages)
        raise ParseError(f"usage: {usage}\n(type `help {spec.name}` for examples)", spec.name)
    first: ParseError | None = None
    matches.sort(key=_numbers_as_names)  # "history 1000" means N, so its error is the one to show
    for binding in matches:
        try:
            return _convert(spec, binding, config)
        except ParseError as exc:
            first = first or exc
    assert first is not None
    raise first


# --- text ---------------------------------------------------------------------------------------


def patch_phrase(patches: Sequence[str]) -> str:
    """``topk patch`` / ``topk and fast patches`` / ``a, b and c patches``."""
    names = list(patches)
    if len(names) == 1:
        return f"{names[0]} patch"
    return f"{', '.join(names[:-1])} and {names[-1]} patches"


def parse_too_long(limit: int) -> str:
    """A request longer than any command."""
    return f"that is too long for a command (at most {limit} characters) - type `help`"
