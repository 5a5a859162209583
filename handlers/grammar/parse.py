"""The command table: every verb declared once, as format strings (StackStorm action aliases).

``restart {job} [with {patches} [patch|patches]] [without {without} [patch|patches]] [fresh cache]``
is at once the parser's input, the usage line shown when arguments are wrong
(``restart JOB [with PATCH[, PATCH and PATCH] [patch(es)]] …``) and the ``help`` text.

Format language:

- a word matches itself, case-insensitively; ``a|b`` matches either;
- ``{slot}`` matches one typed argument (:data:`SLOTS`): names are looked up in the config
  later, numbers and durations are bounded, ``on|off`` is a choice — nothing else is accepted;
- ``[ … ]`` is optional; consecutive optional groups may come in any order, each at most once
  (``[ … ]...`` may repeat, as ``--patch a --patch b``), optionally joined by ``,``/``and``.

This module only matches shapes; :mod:`handlers.grammar.commands` turns a match into a typed command.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from enum import IntEnum
from functools import cached_property
from itertools import islice
from typing import TypeAlias

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*\Z")  #: the shape of a job, host, patch or verb name
NUMBER = re.compile(r"[0-9]{1,9}\Z")
CONNECTORS = frozenset({",", "and", "&"})
MAX_MATCHES = 16  #: complete matches collected per request before choosing one


class Role(IntEnum):
    """Roles nest: admin ⊇ operator ⊇ viewer."""

    VIEWER = 1
    OPERATOR = 2
    ADMIN = 3

    @property
    def label(self) -> str:
        """``viewer`` / ``operator`` / ``admin``."""
        return self.name.lower()


@dataclass(frozen=True)
class SlotType:
    """What one ``{slot}`` accepts."""

    #: ``name`` (one name), ``names`` (a list of names), ``int``, ``duration``, ``choice``,
    #: ``text`` (one or more words of free text, a reason: never looked up, never run)
    kind: str
    metavar: str  #: how usage lines show it
    low: int = 0  #: smallest accepted value (ints: the value; durations: seconds)
    high: int = 0
    choices: tuple[str, ...] = ()  #: the accepted words of a ``choice``


SLOTS: dict[str, SlotType] = {
    "job": SlotType("name", "JOB"),
    "host": SlotType("name", "HOST"),
    "topic": SlotType("name", "VERB"),
    "patches": SlotType("names", "PATCH[, PATCH and PATCH]"),
    "without": SlotType("names", "PATCH"),
    "lines": SlotType("int", "N", 1, 500),
    "count": SlotType("int", "N", 1, 100),
    "for_s": SlotType("duration", "DURATION", 1, 7 * 86400),
    "state": SlotType("choice", "on|off", choices=("on", "off")),
    "run": SlotType("name", "RUN"),
    "reason": SlotType("text", '"REASON"'),
    "target": SlotType("name", "JOB|HOST"),  #: a job or, failing that, a host
    "node": SlotType("name", "NODE"),  #: a node of a Slurm cluster, as Slurm names it
    "exclude": SlotType("names", "NODE[,NODE]"),  #: nodes a relaunch leaves out
    "from_step": SlotType("int", "S", 0, 10**12),  #: the checkpoint step a restart resumes at
}

FLAGS = frozenset({"fresh_cache", "attempts"})  #: options set by an optional group of words

DEFAULT_LINES = 30  #: ``logs JOB`` without N
DEFAULT_COUNT = 10  #: ``history`` without N


# --- the table ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class VerbSpec:
    """One verb: its format (its first word is the verb's name), the least role it needs, a line
    for ``help``, examples."""

    format: str
    role: Role
    summary: str
    examples: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()
    acts: bool = False  #: changes a job (it may need confirmation and takes the lock)

    @property
    def name(self) -> str:
        """The verb (``restart``): the format's first word."""
        return self.format.split()[0]

    @cached_property
    def pattern(self) -> Seq:
        """The compiled format."""
        return compile_format(self.format)

    @cached_property
    def usage(self) -> str:
        """The usage line: ``restart JOB [with PATCH[, PATCH and PATCH] [patch(es)]] …``."""
        return render_usage(self.pattern)


GRAMMAR: tuple[VerbSpec, ...] = (
    VerbSpec(
        "restart {job} [with {patches} [patch|patches]] [without {without} [patch|patches]] [fresh cache]"
        " [--patch|--patches {patches}]... [--without {without}]... [--fresh-cache]"
        " [--break-glass {reason}]"
        " [excluding {exclude}] [--exclude {exclude}]..."
        " [from step {from_step}]",
        Role.OPERATOR,
        "stop the job, clear caches and apply patches if asked, relaunch it, then verify"
        " (a Slurm job: excluding nodes leaves them out; from step S: resume at checkpoint S)",
        (
            "restart dflash",
            "restart dflash excluding n2,n3",
            "restart dflash from step 530",
            "restart dflash with topk patch",
            "restart dflash with topk and fast patches without old patch fresh cache",
            "restart dflash --patch topk --fresh-cache",
            'restart dflash --break-glass "NCCL hang, approvers asleep"',
        ),
        acts=True,
    ),
    VerbSpec(
        "start {job}",
        Role.OPERATOR,
        "launch the job if it is not running",
        ("start dflash",),
        acts=True,
    ),
    VerbSpec(
        "stop {job}",
        Role.OPERATOR,
        "stop the job (SIGTERM, then SIGKILL)",
        ("stop dflash",),
        acts=True,
    ),
    VerbSpec(
        "cancel {job}",
        Role.OPERATOR,
        "cancel the job's restart in flight at its next step boundary",
        ("cancel dflash",),
    ),
    VerbSpec(
        "status [{job}]",
        Role.VIEWER,
        "state, PID, processes, uptime, last restart, lock and patches of one job or all",
        ("status", "status dflash"),
    ),
    VerbSpec(
        "logs {job} [{lines} [lines]]",
        Role.VIEWER,
        f"the last N lines of the job's log (default {DEFAULT_LINES}, at most {SLOTS['lines'].high})",
        ("logs dflash", "logs dflash 100"),
        aliases=("log", "tail"),
    ),
    VerbSpec(
        "digest [{job}]",
        Role.VIEWER,
        "throughput digest now: tokens/s, step time, top-k accuracy, per GPU, with a chart",
        ("digest", "digest dflash"),
    ),
    VerbSpec(
        "history [{job}] [{count}] [--attempts]",
        Role.VIEWER,
        f"the last N runs with their verdicts (default {DEFAULT_COUNT}) and recent refused requests; "
        "--attempts: one row per attempt (started, resumed at, reached, steps/s, how it ended, steps lost)",
        ("history", "history dflash", "history dflash 20", "history dflash --attempts"),
    ),
    VerbSpec(
        "follow {run}",
        Role.VIEWER,
        "a run's steps as they happen, then its verdict (from any process; the exit code is the verdict's)",
        ("follow r-7",),
    ),
    VerbSpec(
        "patches {job}",
        Role.VIEWER,
        "the job's patches: available and in effect",
        ("patches dflash",),
    ),
    VerbSpec(
        "checkpoints {job}",
        Role.VIEWER,
        "the job's checkpoints, newest first: step, time, size, files, verified or damaged",
        ("checkpoints dflash",),
        aliases=("checkpoint", "ckpt"),
    ),
    VerbSpec(
        "lock {job}",
        Role.VIEWER,
        "who holds the job's restart lock, since when, at which step",
        ("lock dflash",),
    ),
    VerbSpec(
        "unlock {job}",
        Role.ADMIN,
        "force the job's restart lock free (audited)",
        ("unlock dflash",),
    ),
    VerbSpec(
        "approve {run}",
        Role.VIEWER,
        "approve a request waiting under the two-person rule, and run it (approvers only, never your own)",
        ("approve r-7",),
    ),
    VerbSpec(
        "deny {run} [{reason}]",
        Role.VIEWER,
        "deny a request waiting for approval, with a reason (approvers; its requester withdraws it)",
        ("deny r-7", "deny r-7 not during the eval run"),
    ),
    VerbSpec(
        "pending [{job}]",
        Role.VIEWER,
        "requests waiting for approval: what, who asked, the patches' hashes, who may approve",
        ("pending", "pending dflash"),
    ),
    VerbSpec(
        "watch {job} {state} [for {for_s}]",
        Role.OPERATOR,
        "turn liveness alerts on or off; off for a while expires by itself",
        ("watch dflash off for 2h", "watch dflash on"),
    ),
    VerbSpec(
        "ack {job}",
        Role.OPERATOR,
        "acknowledge the job's open incident: no repeats until it resolves",
        ("ack dflash",),
    ),
    VerbSpec(
        "maintenance {job} [for] {for_s} [{reason}]",
        Role.OPERATOR,
        "a planned window: no alerts and no escalation for the job for DURATION, announced in its "
        "channel with the reason",
        ('maintenance dflash 2h "driver upgrade"', "maintenance dflash for 30m"),
    ),
    VerbSpec(
        "oncall",
        Role.VIEWER,
        "what is open: each incident, who acknowledged it, and when and to whom it escalates next",
        ("oncall",),
    ),
    VerbSpec(
        "gpus {host}",
        Role.VIEWER,
        "GPU utilisation, memory, power and processes on a host",
        ("gpus gpu1",),
        aliases=("gpu",),
    ),
    VerbSpec(
        "nodes [{target}]",
        Role.VIEWER,
        "the nodes of a Slurm cluster (a job's, a login node's, or every one Pitstop knows): Slurm's"
        " state and reason, the jobs on each, what Pitstop holds against it",
        ("nodes", "nodes dflash", "nodes gpu1"),
        aliases=("node",),
    ),
    VerbSpec(
        "drain {node} {reason} [on {job}]",
        Role.ADMIN,
        "drain a Slurm node with a reason (scontrol update State=DRAIN); on JOB: the cluster of that"
        " job, where several have the node (audited, announced)",
        ("drain n2 ECC errors on GPU 3", "drain n2 flaky NIC on dflash"),
    ),
    VerbSpec(
        "undrain {node} [on {job}]",
        Role.ADMIN,
        "return a drained Slurm node to service (scontrol update State=RESUME; audited, announced)",
        ("undrain n2", "undrain n2 on dflash"),
    ),
    VerbSpec(
        "help [{topic}]",
        Role.VIEWER,
        "this list, or one command's usage",
        ("help", "help restart"),
    ),
)

VERBS: dict[str, VerbSpec] = {v.name: v for v in GRAMMAR}
#: each verb and alias (lower case) → its verb's spec
ALIASES: dict[str, VerbSpec] = {a: v for v in GRAMMAR for a in (v.name, *v.aliases)}


# --- format strings -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Lit:
    """A literal word (or alternatives)."""

    words: tuple[str, ...]


@dataclass(frozen=True)
class Slot:
    """A typed argument."""

    name: str


@dataclass(frozen=True)
class Opt:
    """An optional group; ``repeat`` when written ``[ … ]...``; ``flag`` when it sets one of
    :data:`FLAGS` (a group of words only: ``[fresh cache]`` and ``[--fresh-cache]`` set ``fresh_cache``)."""

    body: Seq
    repeat: bool = False
    flag: str | None = None


#: a sequence of items: a format, or the body of an optional group
Seq: TypeAlias = "tuple[Lit | Slot | Opt, ...]"


_FORMAT_TOKEN = re.compile(r"\]\.\.\.|\[|\]|\{[a-z_]+\}|[^\s\[\]{}]+")


def _flag_of(body: Seq) -> str | None:
    if not body or not all(isinstance(i, Lit) for i in body):
        return None
    name = "_".join(i.words[0].lstrip("-").replace("-", "_") for i in body if isinstance(i, Lit))
    return name if name in FLAGS else None


def compile_format(fmt: str) -> Seq:
    """Compile one format string; ValueError if it is malformed or names an unknown slot."""
    tokens = _FORMAT_TOKEN.findall(fmt)
    if "".join(tokens) != "".join(fmt.split()):
        raise ValueError(f"bad format {fmt!r}")

    def seq(it: Iterator[str], depth: int) -> tuple[Seq, str]:
        """The items up to the ``]`` or ``]...`` that closes them (returned with them; "" at the end)."""
        items: list[Lit | Slot | Opt] = []
        for tok in it:
            if tok == "[":
                body, closer = seq(it, depth + 1)
                items.append(Opt(body, repeat=closer == "]...", flag=_flag_of(body)))
            elif tok in ("]", "]..."):
                if depth == 0:
                    raise ValueError(f"unbalanced ']' in {fmt!r}")
                return tuple(items), tok
            elif tok.startswith("{"):
                name = tok[1:-1]
                if name not in SLOTS:
                    raise ValueError(f"unknown slot {name!r} in {fmt!r}")
                items.append(Slot(name))
            else:
                items.append(Lit(tuple(w.lower() for w in tok.split("|"))))
        if depth:
            raise ValueError(f"unbalanced '[' in {fmt!r}")
        return tuple(items), ""

    return seq(iter(tokens), 0)[0]


def render_usage(pattern: Seq) -> str:
    """A compiled format as a usage line (``{job}`` → ``JOB``, ``patch|patches`` → ``patch(es)``)."""
    out: list[str] = []
    for item in pattern:
        if isinstance(item, Lit):
            w = item.words
            plural = w[1].removeprefix(w[0]) if len(w) == 2 else ""
            out.append(f"{w[0]}({plural})" if plural in ("s", "es") else "|".join(w))
        elif isinstance(item, Slot):
            out.append(SLOTS[item.name].metavar)
        else:
            out.append(f"[{render_usage(item.body)}]" + ("..." if item.repeat else ""))
    return " ".join(out)


# --- matching -----------------------------------------------------------------------------------

Binding = tuple[tuple[str, str | tuple[str, ...]], ...]


def _names(tokens: tuple[str, ...], i: int) -> Iterator[tuple[int, tuple[str, ...]]]:
    """Lists of names from ``i``, shortest first: ``a``, ``a, b``, ``a and b``, ``a b``."""
    names: list[str] = []
    while i < len(tokens) and NAME.match(tokens[i]):
        names.append(tokens[i])
        yield i + 1, tuple(names)
        k = i + 1
        while k < len(tokens) and tokens[k].lower() in CONNECTORS:
            k += 1
        if k - (i + 1) > 2:  # at most two connectors between names
            return
        i = k


def _slot(slot: Slot, tokens: tuple[str, ...], i: int) -> Iterator[tuple[int, str | tuple[str, ...]]]:
    if i >= len(tokens):
        return
    kind, tok = SLOTS[slot.name], tokens[i]
    if kind.kind == "names":
        yield from _names(tokens, i)
    elif kind.kind == "text":
        for j in range(i + 1, len(tokens) + 1):  # shortest first: later options keep their words
            yield j, tokens[i:j]
    elif kind.kind == "choice":
        if tok.lower() in kind.choices:
            yield i + 1, tok.lower()
    elif (NUMBER if kind.kind == "int" else NAME).match(tok) and (
        kind.kind != "duration" or tok[0].isdigit()
    ):
        yield i + 1, tok


def _seq(
    items: tuple[Lit | Slot | Opt, ...], pos: int, tokens: tuple[str, ...], i: int, bound: Binding
) -> Iterator[tuple[int, Binding]]:
    if pos == len(items):
        yield i, bound
        return
    item = items[pos]
    if isinstance(item, Lit):
        if i < len(tokens) and tokens[i].lower() in item.words:
            yield from _seq(items, pos + 1, tokens, i + 1, bound)
    elif isinstance(item, Slot):
        for j, value in _slot(item, tokens, i):
            yield from _seq(items, pos + 1, tokens, j, (*bound, (item.name, value)))
    else:
        end = pos
        while end < len(items) and isinstance(items[end], Opt):
            end += 1
        group = tuple(o for o in items[pos:end] if isinstance(o, Opt))

        def unordered(
            remaining: frozenset[int], i: int, bound: Binding, first: bool
        ) -> Iterator[tuple[int, Binding]]:
            """The groups not yet used, in any order, then the items after them."""
            starts = [i]
            if not first and i < len(tokens) and tokens[i].lower() in CONNECTORS:
                starts.append(i + 1)  # "… with topk patch and fresh cache"
            for k in sorted(remaining):
                opt = group[k]
                for start in starts:
                    for j, inner in _seq(opt.body, 0, tokens, start, bound):
                        if j == start:
                            continue  # consumed nothing: never loop
                        if opt.flag is not None:
                            inner = (*inner, (opt.flag, "on"))
                        yield from unordered(remaining if opt.repeat else remaining - {k}, j, inner, False)
            yield from _seq(items, end, tokens, i, bound)

        yield from unordered(frozenset(range(len(group))), i, bound, True)


def match(spec: VerbSpec, tokens: tuple[str, ...]) -> list[Binding]:
    """Every way (up to :data:`MAX_MATCHES`) ``tokens`` (the verb included) fit the verb's format,
    each as the slot values it binds, in the order the slots prefer (none: [])."""
    complete = (bound for j, bound in _seq(spec.pattern, 1, tokens, 1, ()) if j == len(tokens))
    return list(islice(complete, MAX_MATCHES))
