"""The command grammar: texts → typed commands, texts → exact errors, and no text ever reaching a
command line (a property test over arbitrary strings)."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bot.console.say import parse_main
from handlers.grammar import parse as grammar
from handlers.grammar.commands import Command, ParseError, normalise, parse
from handlers.text import parse_too_long
from tests.support_handlers import handler_config

CONFIG = handler_config()


def _c(
    verb: str, job: str | None = None, host: str | None = None, patches: tuple[str, ...] = (), **opts: Any
) -> Command:
    return Command(verb, job=job, host=host, patches=patches, options=opts)


RESTART = {"without": (), "fresh_cache": False}

CASES: list[tuple[str, Command]] = [
    # restart: words
    ("restart dflash", _c("restart", "dflash", **RESTART)),
    ("restart DFLASH", _c("restart", "dflash", **RESTART)),
    ("ReStArT dFlAsH with TOPK patch", _c("restart", "dflash", patches=("topk",), **RESTART)),
    ("restart dflash with topk", _c("restart", "dflash", patches=("topk",), **RESTART)),
    (
        "restart dflash with topk, fast and old patches",
        _c("restart", "dflash", patches=("topk", "fast", "old"), **RESTART),
    ),
    ("restart dflash with topk,fast patches", _c("restart", "dflash", patches=("topk", "fast"), **RESTART)),
    (
        "restart dflash with topk patch without old patch fresh cache",
        _c("restart", "dflash", patches=("topk",), without=("old",), fresh_cache=True),
    ),
    (
        "restart dflash fresh cache with topk patch",
        _c("restart", "dflash", patches=("topk",), without=(), fresh_cache=True),
    ),
    (
        "restart dflash with topk patch and fresh cache",
        _c("restart", "dflash", patches=("topk",), without=(), fresh_cache=True),
    ),
    ("restart dflash without old patch", _c("restart", "dflash", without=("old",), fresh_cache=False)),
    ("restart dflash with topk and topk patches", _c("restart", "dflash", patches=("topk",), **RESTART)),
    # restart: flags, as typed and as Slack renders them
    (
        "restart dflash --patch topk --fresh-cache",
        _c("restart", "dflash", patches=("topk",), without=(), fresh_cache=True),
    ),
    (
        "restart dflash —patch topk —fresh-cache",
        _c("restart", "dflash", patches=("topk",), without=(), fresh_cache=True),
    ),
    ("restart dflash –patch topk", _c("restart", "dflash", patches=("topk",), **RESTART)),
    (
        "restart DFlash with topk patch —fresh-cache",
        _c("restart", "dflash", patches=("topk",), without=(), fresh_cache=True),
    ),
    (
        "restart dflash fresh cache --patch topk without old",
        _c("restart", "dflash", patches=("topk",), without=("old",), fresh_cache=True),
    ),
    (
        "restart dflash --patch=topk --patch fast --without old",
        _c("restart", "dflash", patches=("topk", "fast"), without=("old",), fresh_cache=False),
    ),
    ("restart dflash --patches topk,fast", _c("restart", "dflash", patches=("topk", "fast"), **RESTART)),
    # Slack markup and typography
    ("<@U0BOT00001> restart dflash", _c("restart", "dflash", **RESTART)),
    ("<@U0BOT00001|pitstop>: restart dflash", _c("restart", "dflash", **RESTART)),
    ("restart “dflash” with ‘topk’ patch", _c("restart", "dflash", patches=("topk",), **RESTART)),
    ("`restart dflash`", _c("restart", "dflash", **RESTART)),
    ("restart\u00a0dflash", _c("restart", "dflash", **RESTART)),
    ("restart <http://dflash.example|dflash>", _c("restart", "dflash", **RESTART)),
    ("/train status", _c("status")),
    ("  status   ", _c("status")),
    ("", _c("help")),
    ("<@U0BOT00001>", _c("help")),
    # the other verbs
    ("start dflash", _c("start", "dflash")),
    ("stop Eagle", _c("stop", "eagle")),
    ("cancel dflash", _c("cancel", "dflash")),
    ("status", _c("status")),
    ("STATUS dflash", _c("status", "dflash")),
    ("logs dflash", _c("logs", "dflash", lines=30)),
    ("logs dflash 100", _c("logs", "dflash", lines=100)),
    ("logs dflash 500 lines", _c("logs", "dflash", lines=500)),
    ("log dflash 1", _c("logs", "dflash", lines=1)),
    ("digest", _c("digest")),
    ("digest dflash", _c("digest", "dflash")),
    ("history", _c("history", count=10)),
    ("history dflash", _c("history", "dflash", count=10)),
    ("history 25", _c("history", count=25)),
    ("history dflash 5", _c("history", "dflash", count=5)),
    ("history 5 dflash", _c("history", "dflash", count=5)),
    ("patches dflash", _c("patches", "dflash")),
    ("lock dflash", _c("lock", "dflash")),
    ("unlock dflash", _c("unlock", "dflash")),
    ("watch dflash off", _c("watch", "dflash", state="off")),
    ("watch dflash ON", _c("watch", "dflash", state="on")),
    ("watch dflash off for 2h", _c("watch", "dflash", state="off", for_s=7200)),
    ("watch dflash off for 30m", _c("watch", "dflash", state="off", for_s=1800)),
    ("watch dflash off for 90s", _c("watch", "dflash", state="off", for_s=90)),
    ("watch dflash off for 1d", _c("watch", "dflash", state="off", for_s=86400)),
    ("watch dflash off for 1.5h", _c("watch", "dflash", state="off", for_s=5400)),
    ("ack dflash", _c("ack", "dflash")),
    ("gpus gpu1", _c("gpus", host="gpu1")),
    ("GPUS GPU2", _c("gpus", host="gpu2")),
    ("help", _c("help")),
    ("help restart", _c("help", topic="restart")),
    ("help LOG", _c("help", topic="logs")),
]


@pytest.mark.parametrize(("text", "expected"), CASES, ids=[c[0] or "<empty>" for c in CASES])
def test_text_parses_to_command(text: str, expected: Command) -> None:
    """Each form of each verb parses to the expected typed command, whatever Slack did to the text."""
    assert parse(text, CONFIG) == expected


KNOWN_JOBS = "(known: dflash, guarded, eagle, solo)"
VERBS = ", ".join(v.name for v in grammar.GRAMMAR)
RESTART_USAGE = (
    "usage: restart JOB [with PATCH[, PATCH and PATCH] [patch(es)]] [without PATCH [patch(es)]] [fresh cache]"
    " [--patch(es) PATCH[, PATCH and PATCH]]... [--without PATCH]... [--fresh-cache]"
    ' [--break-glass "REASON"] [excluding NODE[,NODE]] [--exclude NODE[,NODE]]... [from step S]\n'
    "(type `help restart` for examples)"
)

ERRORS: list[tuple[str, str]] = [
    ("restart dflsh", f"unknown job 'dflsh' — did you mean 'dflash'? {KNOWN_JOBS}"),
    ("status eagel", f"unknown job 'eagel' — did you mean 'eagle'? {KNOWN_JOBS}"),
    ("logs zzz", f"unknown job 'zzz' {KNOWN_JOBS}"),
    (
        "rstart dflash",
        f"unknown command 'rstart' — did you mean 'restart' or 'start' or 'status'? (known: {VERBS})",
    ),
    (
        "help rstart",
        f"unknown command 'rstart' — did you mean 'restart' or 'start' or 'status'? (known: {VERBS})",
    ),
    (
        "restart dflash with topq patch",
        "unknown patch 'topq' for dflash — did you mean 'topk'? (known: topk, fast, old)",
    ),
    ("restart eagle with topk patch", "unknown patch 'topk' for eagle (none configured)"),
    ("gpus gpu3", "unknown host 'gpu3' — did you mean 'gpu2' or 'gpu1'? (known: gpu1, gpu2)"),
    ("restart", RESTART_USAGE),
    ("restart dflash eagle", RESTART_USAGE),
    ("restart dflash with", RESTART_USAGE),
    ("status dflash eagle", "usage: status [JOB]\n(type `help status` for examples)"),
    ("logs", "usage: logs JOB [N [lines]]\n(type `help logs` for examples)"),
    ("watch dflash", "usage: watch JOB on|off [for DURATION]\n(type `help watch` for examples)"),
    ("watch dflash maybe", "usage: watch JOB on|off [for DURATION]\n(type `help watch` for examples)"),
    ("logs dflash 0", "lines must be between 1 and 500, got 0"),
    ("logs dflash 501", "lines must be between 1 and 500, got 501"),
    ("history 1000", "N must be between 1 and 100, got 1000"),
    ("watch dflash off for 5x", "'5x' is not a duration - use e.g. 90s, 30m, 2h or 1d (at most 7 d)"),
    ("watch dflash off for 8d", "duration '8d' is out of range - give at least 1 s and at most 7 d"),
    (
        "watch dflash off for 99999999999h",
        "duration '99999999999h' is out of range - give at least 1 s and at most 7 d",
    ),
    (
        "watch dflash off for " + "9" * 400,
        f"{'9' * 400!r} is not a duration - use e.g. 90s, 30m, 2h or 1d (at most 7 d)",
    ),
    ("watch dflash off for nan", "usage: watch JOB on|off [for DURATION]\n(type `help watch` for examples)"),
    ("watch dflash on for 2h", "`for DURATION` pauses watching for a while: say `watch dflash off for 2h`"),
    ("restart dflash with topk without topk", "patch 'topk' cannot be both added and removed"),
    ("status " + "x" * 600, parse_too_long(500)),
]


@pytest.mark.parametrize(("text", "message"), ERRORS, ids=[e[0][:40] for e in ERRORS])
def test_text_gives_exact_error(text: str, message: str) -> None:
    """Bad input gets one ParseError (exit code 2) whose message says what to do next."""
    with pytest.raises(ParseError) as info:
        parse(text, CONFIG)
    assert info.value.message == message
    assert int(info.value.exit_code) == 2


INJECTIONS = [
    "restart dflash; rm -rf /",
    "restart dflash && reboot",
    "restart $(reboot)",
    "restart `reboot`",
    "restart dflash`reboot`",
    "restart dflash\nreboot",
    "restart dflash | sh",
    "restart ../../etc/passwd",
    "restart dflash with $(reboot) patch",
    "restart dflash with topk;reboot patch",
    "logs dflash 10;reboot",
    "logs dflash -1",
    "gpus gpu1;reboot",
    "watch dflash off for 1h;reboot",
    "restart dflash --patch 'topk; reboot'",
    "restart dflash > /etc/passwd",
]


@pytest.mark.parametrize("text", INJECTIONS)
def test_injection_attempts_are_refused(text: str) -> None:
    """Shell metacharacters, command substitution, backticks and newlines never parse into a command."""
    with pytest.raises(ParseError):
        parse(text, CONFIG)


def test_normalise_undoes_slack_markup() -> None:
    """Mentions, channels, user groups, links, entities, smart quotes and dashes come back plain."""
    text = (
        "<@U0BOT00001> hi <@U0ABC|alice> in <#C0123|general> cc <!subteam^S0OPS|@oncall> "
        "<!here> see <https://example.com/x|the doc> &amp; <https://example.com> “q” ‘s’ a—b c–d"
    )
    assert normalise(text) == (
        "hi @U0ABC in #general cc @oncall @here see the doc & https://example.com \"q\" 's' a--b c--d"
    )


def test_usage_and_help_come_from_the_table() -> None:
    """Every verb's usage line is rendered from its format string, so help and errors agree with
    parsing (the examples read with dflash a Slurm job: node verbs need one)."""
    dflash = CONFIG.jobs["dflash"].model_copy(update={"engine": "slurm", "slurm": {"script": "/s"}})
    slurm = CONFIG.model_copy(update={"jobs": {**CONFIG.jobs, "dflash": dflash}})
    rolls = CONFIG.jobs["dflash"].model_copy(update={"resume_from": ["--resume-step", "{step}"]})
    rollback = CONFIG.model_copy(update={"jobs": {**CONFIG.jobs, "dflash": rolls}})  # from step S: ssh
    for spec in grammar.GRAMMAR:
        assert spec.usage.split()[0] == spec.name
        for example in spec.examples:
            assert parse(example, rollback if " from step " in example else slurm).verb == spec.name, example
    assert grammar.VERBS["logs"].usage == "logs JOB [N [lines]]"
    assert grammar.VERBS["watch"].usage == "watch JOB on|off [for DURATION]"


def test_roles_cover_every_verb() -> None:
    """The table gives each verb the role the issue lists (admin ⊇ operator ⊇ viewer)."""
    roles = {spec.name: spec.role.label for spec in grammar.GRAMMAR}
    assert roles == {
        "status": "viewer",
        "logs": "viewer",
        "digest": "viewer",
        "history": "viewer",
        "patches": "viewer",
        "lock": "viewer",
        "checkpoints": "viewer",
        "gpus": "viewer",
        "help": "viewer",
        "restart": "operator",
        "start": "operator",
        "stop": "operator",
        "cancel": "operator",
        "watch": "operator",
        "ack": "operator",
        "oncall": "viewer",
        "maintenance": "operator",
        "unlock": "admin",
        "approve": "viewer",
        "deny": "viewer",
        "pending": "viewer",
        "follow": "viewer",
        "nodes": "viewer",
        "drain": "admin",
        "undrain": "admin",
    }


def test_command_json_round_trip() -> None:
    """A command survives dumps/loads (confirmations and the audit trail store it so)."""
    cmd = parse("restart dflash with topk patch without old patch fresh cache", CONFIG)
    assert Command.loads(cmd.dumps()) == cmd
    assert cmd.text() == "restart dflash with topk patch without old patch fresh cache"
    assert parse(cmd.text(), CONFIG) == cmd


# --- the property: anything parses or raises ParseError, and parsed fields are config names --------

_NAME_CHARS = st.sampled_from(
    [
        "restart",
        "start",
        "stop",
        "status",
        "logs",
        "watch",
        "with",
        "without",
        "patch",
        "patches",
        "fresh",
        "cache",
        "--patch",
        "—fresh-cache",
        "dflash",
        "DFlash",
        "eagle",
        "topk",
        "fast",
        "old",
        "gpu1",
        "for",
        "on",
        "off",
        "2h",
        "90",
        "500",
        "501",
        ",",
        "and",
        "$(reboot)",
        "`x`",
        ";",
        "&&",
        "|",
        "\n",
        "'",
        "“",
        "<@U0X>",
        "<#C1|c>",
        "<http://a|b>",
        "help",
        "history",
        "lock",
        "gpus",
        "lines",
        "-1",
        "1e9",
    ]
)
_TEXTS = st.one_of(
    st.text(max_size=200),
    st.lists(_NAME_CHARS, max_size=12).map(" ".join),
    st.lists(st.one_of(_NAME_CHARS, st.text(max_size=8)), max_size=10).map(" ".join),
)


def _only_config_values(cmd: Command) -> None:
    assert cmd.verb in grammar.VERBS
    assert cmd.job is None or cmd.job in CONFIG.jobs
    assert cmd.host is None or cmd.host in CONFIG.hosts
    allowed = set(CONFIG.jobs[cmd.job].patches) if cmd.job else set()
    assert set(cmd.patches) <= allowed and set(cmd.without) <= allowed
    for key, value in cmd.options.items():
        if key in ("lines", "count", "for_s"):
            spec = grammar.SLOTS[key]
            assert isinstance(value, int) and spec.low <= value <= spec.high
        elif key == "state":
            assert value in ("on", "off")
        elif key == "topic":
            assert value in grammar.VERBS
        elif key in ("fresh_cache", "attempts"):
            assert isinstance(value, bool)
        elif key == "run":  # approve, deny, follow: a run id, lower-cased
            assert isinstance(value, str) and value.startswith("r-") and value == value.lower()
        elif key in ("reason", "break_glass", "node"):  # free text, or a node name Slurm is asked about
            assert isinstance(value, str) and value
        elif key == "exclude":
            assert isinstance(value, tuple) and all(isinstance(n, str) and n for n in value)
        elif key == "from_step":
            assert isinstance(value, int) and value >= 0
        else:
            assert key == "without"


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_TEXTS)
def test_any_text_parses_or_raises_parse_error(text: str) -> None:
    """Any string either parses to a command made only of config names and bounded ints, or raises
    ParseError — never another exception — so no typed text can reach a remote command line."""
    try:
        cmd = parse(text, CONFIG)
    except ParseError as exc:
        assert exc.message
        return
    _only_config_values(cmd)


def test_parse_cli_prints_json_or_error() -> None:
    """``pitstop parse`` prints one JSON object and exits 0, or prints the error and exits 2."""
    out, err = io.StringIO(), io.StringIO()
    assert parse_main(CONFIG, "restart DFlash —patch topk —fresh-cache", out=out, err=err) == 0
    assert json.loads(out.getvalue()) == {
        "verb": "restart",
        "job": "dflash",
        "host": None,
        "patches": ["topk"],
        "options": {"without": [], "fresh_cache": True},
    }
    out, err = io.StringIO(), io.StringIO()
    assert parse_main(CONFIG, "logs dflsh", out=out, err=err) == 2
    assert out.getvalue() == ""
    assert err.getvalue().strip() == f"unknown job 'dflsh' — did you mean 'dflash'? {KNOWN_JOBS}"
    out = io.StringIO()
    assert parse_main(CONFIG, "watch dflash off for 30m", out=out, err=err) == 0
    assert json.loads(out.getvalue())["options"] == {"state": "off", "for_s": 1800}
