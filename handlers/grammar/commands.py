"""Typed commands: what a person asked for, checked against the config, or one clear error.

:func:`parse` turns text into a frozen :class:`Command` or raises :class:`ParseError`, never
anything else; what a person typed is first read as the grammar reads it: Slack's markup and
typography undone (:func:`normalise`), then split into words (:func:`tokenise`).  Jobs, hosts
and patches come back in their configured spelling, numbers and durations are bounded integers,
``on|off`` is a choice: nothing typed ever reaches a command line::

    parse("restart DFlash with topk patch", config) == Command("restart", job="dflash",
        patches=("topk",), options={"without": (), "fresh_cache": False})
"""

from __future__ import annotations

import difflib
import json
import re
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Generic, TypeVar

from handlers.grammar import parse as grammar
from handlers.grammar.parse import SLOTS, Binding, VerbSpec
from handlers.text import parse_too_long, patch_phrase
from pipeline import fmt
from pipeline.config import Config
from pipeline.engines import on_nodes, resumes_at_step
from pipeline.errors import ExitCode, PitstopError

MAX_TEXT = 500  #: characters; longer requests are refused before parsing
MAX_TOKENS = 64

OptionValue = bool | int | str | tuple[str, ...] | None
T = TypeVar("T")
D = TypeVar("D")


class ParseError(PitstopError):
    """Text that is not a command, with a message a person can act on (did-you-mean, usage);
    ``verb`` when the text got that far."""

    code = "parse_error"
    exit_code = ExitCode.USAGE

    def __init__(self, message: str, verb: str | None = None) -> None:
        super().__init__(message)
        self.verb = verb


class _Option(Generic[T, D]):
    """One of :attr:`Command.options`, read as an attribute: its value when it is of type ``kind``
    exactly (so a bool is never read as an int), else ``default``."""

    def __init__(self, key: str, kind: type[T], default: D) -> None:
        self.key, self.kind, self.default = key, kind, default

    def __get__(self, command: Command, owner: object = None) -> T | D:
        value = command.options.get(self.key)
        return value if type(value) is self.kind else self.default


@dataclass(frozen=True)
class Command:
    """A parsed, validated request; names in their configured spelling."""

    verb: str  #: canonical (``restart``, ``status`` …)
    job: str | None = None
    host: str | None = None  #: ``gpus``
    patches: tuple[str, ...] = ()  #: patch names to add (``restart … with P patch``)
    #: read-only, read through the attributes below: ``without``, ``fresh_cache``, ``break_glass``
    #: (restart), ``lines`` (logs), ``count``, ``attempts`` (history), ``state``, ``for_s`` (watch),
    #: ``run`` (approve, deny, follow), ``reason`` (approve, deny), ``topic`` (help)
    options: Mapping[str, OptionValue] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "options", MappingProxyType(dict(self.options)))

    @property
    def spec(self) -> VerbSpec:
        """The verb's entry in the command table."""
        return grammar.VERBS[self.verb]

    without = _Option("without", tuple, ())  #: patches to remove (restart)
    fresh_cache = _Option("fresh_cache", bool, False)  #: clear the job's caches (restart)
    lines = _Option("lines", int, grammar.DEFAULT_LINES)  #: log lines asked for (logs)
    count = _Option("count", int, grammar.DEFAULT_COUNT)  #: runs asked for (history)
    attempts = _Option("attempts", bool, False)  #: one row per attempt, not per run (``history --attempts``)
    for_s = _Option("for_s", int, None)  #: seconds watching stays off (``watch … off for DURATION``)
    state = _Option("state", str, None)  #: ``on`` or ``off`` (watch)
    run_ref = _Option("run", str, None)  #: the run id a request is named by (approve, deny, follow: ``r-7``)
    reason = _Option("reason", str, None)  #: free text: a denial's reason (deny)
    #: an admin's reason for restarting without approval (``--break-glass "REASON"``)
    break_glass = _Option("break_glass", str, None)
    topic = _Option("topic", str, None)  #: the verb ``help`` was asked about
    node = _Option("node", str, None)  #: the Slurm node a node verb acts on (drain, undrain)
    exclude = _Option("exclude", tuple, ())  #: nodes the relaunch leaves out (``restart … excluding n2``)
    from_step = _Option(
        "from_step", int, None
    )  #: the checkpoint step to resume at (``restart … from step S``)

    def dumps(self, separators: tuple[str, str] = (",", ":")) -> str:
        """The command as JSON text, compact unless ``separators`` say otherwise (``pitstop parse``,
        the audit trail, confirmations)."""
        shown = {"verb": self.verb, "job": self.job, "host": self.host, "patches": self.patches}
        return json.dumps({**shown, "options": dict(self.options)}, separators=separators)

    @classmethod
    def loads(cls, text: str) -> Command:
        """The inverse of :meth:`dumps` (for records Pitstop itself wrote); KeyError without a verb."""
        data = json.loads(text)
        options = {k: tuple(v) if isinstance(v, list) else v for k, v in data.get("options", {}).items()}
        return cls(data["verb"], data.get("job"), data.get("host"), tuple(data.get("patches", ())), options)

    def text(self) -> str:
        """The command written out canonically (``restart dflash with topk patch fresh cache``)."""
        count = {"logs": str(self.lines), "history": str(self.count)}.get(self.verb)
        if self.node is not None:  # drain NODE REASON on JOB
            return " ".join(w for w in (self.verb, self.node, self.reason, f"on {self.job}") if w)
        words = (
            *(self.verb, self.job, self.host, self.run_ref, self.state, self.topic, count),
            f"with {patch_phrase(self.patches)}" if self.patches else "",
            f"without {patch_phrase(self.without)}" if self.without else "",
            "fresh cache" if self.fresh_cache else "",
            f'--break-glass "{self.break_glass}"' if self.break_glass is not None else "",
            "--attempts" if self.attempts else "",
            f"for {fmt.duration(self.for_s)}" if self.for_s else "",
            f"excluding {','.join(self.exclude)}" if self.exclude else "",
            f"from step {self.from_step}" if self.from_step is not None else "",
            self.reason or "",
        )
        return " ".join(w for w in words if w)


# --- what a person typed, as the grammar reads it: Slack's markup and typography undone, then words

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
    if (name := next((n for n in known if n.lower() == given.lower()), None)) is None:
        raise _unknown(kind, given, known, verb, where)
    return name


def _from_step(job: str, raw: str, config: Config, verb: str) -> int:
    """The step of ``from step S``: the job must be one whose launch can be told it (ssh, ``resume_from``)."""
    spec = config.jobs[job]
    if not spec.resume_from:
        raise ParseError(
            f"`from step S` needs [jobs.{job}] resume_from, the arguments that make {job} resume at a step "
            '(e.g. ["--resume-step", "{step}"]); see `checkpoints ' + job + "`",
            verb,
        )
    if not resumes_at_step(spec):
        raise ParseError(
            f"`from step S` passes the step to the launch of an ssh job; {job} is a {spec.engine} job", verb
        )
    return _int("from_step", raw, verb)


def _int(slot: str, raw: str, verb: str) -> int:
    kind, value = SLOTS[slot], int(raw)
    if not kind.low <= value <= kind.high:
        what = {"lines": "lines", "from_step": "the step"}.get(slot, "N")
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


#: the options every command of a verb carries, typed or not
_DEFAULTS: dict[str, dict[str, OptionValue]] = {
    "restart": {"without": (), "fresh_cache": False},
    "logs": {"lines": grammar.DEFAULT_LINES},
    "history": {"count": grammar.DEFAULT_COUNT},
}


def _convert(spec: VerbSpec, binding: Binding, config: Config) -> Command:
    verb = spec.name
    raw: dict[str, list[str]] = {}
    for name, value in binding:
        raw.setdefault(name, []).extend([value] if isinstance(value, str) else value)
    one = {name: values[0] for name, values in raw.items()}
    job = _lookup("job", one["job"], list(config.jobs), verb) if "job" in one else None
    host = _lookup("host", one["host"], list(config.hosts), verb) if "host" in one else None
    if "target" in one:  # a job, else a host
        job, host = _target(one["target"], config, verb)
    options = dict(_DEFAULTS.get(verb, {}))
    if "node" in one:
        options["node"] = one["node"]
        job = _node_job(job, config, verb)
    if "exclude" in raw and job is not None:
        if not on_nodes(config.jobs[job]):
            raise ParseError(f"`excluding NODE` leaves Slurm nodes out; {job} is not a Slurm job", verb)
        options["exclude"] = tuple(dict.fromkeys(raw["exclude"]))
    if "from_step" in one and job is not None:
        options["from_step"] = _from_step(job, one["from_step"], config, verb)
    patches = _patches(raw.get("patches", []), job, config, verb) if job is not None else ()
    if "without" in raw and job is not None:
        options["without"] = without = _patches(raw["without"], job, config, verb)
        if both := [p for p in patches if p in without]:
            named = ", ".join(repr(p) for p in both)
            raise ParseError(f"patch {named} cannot be both added and removed", verb)
    options.update(dict.fromkeys(grammar.FLAGS & raw.keys(), True))
    options.update((slot, _int(slot, one[slot], verb)) for slot in ("lines", "count") if slot in one)
    if "reason" in raw:  # a restart's is its break glass
        options["break_glass" if verb == "restart" else "reason"] = _reason(raw["reason"])
    if "run" in one:
        if not _RUN_REF.fullmatch(one["run"].lower()):
            hint = "`follow r-7` (see `history`)" if verb == "follow" else "`approve r-7` (see `pending`)"
            raise ParseError(
                f"{one['run']!r} is not a run id - give it as Pitstop wrote it, e.g. {hint}", verb
            )
        options["run"] = one["run"].lower()
    if "state" in one:
        options["state"] = one["state"]
    if "for_s" in one:
        if verb == "watch" and one.get("state") != "off":  # a duration only makes sense when pausing
            raise ParseError(
                f"`for DURATION` pauses watching for a while: say `watch {job} off for 2h`", verb
            )
        options["for_s"] = parse_duration_seconds(one["for_s"], verb)
    if "topic" in one:
        topic_spec = grammar.ALIASES.get(one["topic"].lower())
        if topic_spec is None:
            raise _unknown("command", one["topic"], list(grammar.VERBS), verb)
        options["topic"] = topic_spec.name
    return Command(verb=verb, job=job, host=host, patches=patches, options=options)


_RUN_REF = re.compile(r"r-[0-9]{1,12}")


def _target(given: str, config: Config, verb: str) -> tuple[str | None, str | None]:
    """``(job, None)`` when ``given`` names a job, else ``(None, host)``; ParseError if neither."""
    for known, pick in ((config.jobs, 0), (config.hosts, 1)):
        if name := next((n for n in known if n.lower() == given.lower()), None):
            return (name, None) if pick == 0 else (None, name)
    raise _unknown("job or host", given, [*config.jobs, *config.hosts], verb)


def _node_job(job: str | None, config: Config, verb: str) -> str | None:
    """The Slurm job a node verb runs through: ``on JOB`` (a Slurm job), else the first Slurm job
    when Pitstop knows one cluster; None when it knows several (the dispatcher asks each).
    :raises ParseError: if ``JOB`` is not a Slurm job, or no Slurm job is configured."""
    slurm_jobs = [n for n, j in config.jobs.items() if on_nodes(j)]
    if job is not None and job not in slurm_jobs:
        raise ParseError(f"{job} is not a Slurm job: `{verb}` acts on the nodes of a Slurm cluster", verb)
    if not slurm_jobs:
        raise ParseError(f"no Slurm job is configured: `{verb}` acts on the clusters of Slurm jobs", verb)
    one_cluster = len({(config.jobs[n].host, *config.jobs[n].exec) for n in slurm_jobs}) == 1
    return job or (slurm_jobs[0] if one_cluster else None)


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
    spec = grammar.ALIASES.get(tokens[0].lower())
    if spec is None:
        raise _unknown("command", tokens[0], list(grammar.VERBS), None)
    matches = grammar.match(spec, tokens) if len(tokens) <= MAX_TOKENS else []
    if not matches:  # its usage line
        raise ParseError(f"usage: {spec.usage}\n(type `help {spec.name}` for examples)", spec.name)
    first: ParseError | None = None
    matches.sort(key=_numbers_as_names)  # "history 1000" means N, so its error is the one to show
    for binding in matches:
        try:
            return _convert(spec, binding, config)
        except ParseError as exc:
            first = first or exc
    assert first is not None
    raise first
