"""The demo's script language: commands, bounded waits, kill, and clear errors for bad lines."""

from __future__ import annotations

from pathlib import Path

import pytest

from bot.demo.script import Kill, Say, Wait, WaitRanks, parse_script
from pipeline.errors import ExitCode, UsageError
from pipeline.state.events import EventKind

ROOT = Path(__file__).resolve().parent.parent


def test_default_script_follows_the_story() -> None:
    """demo/script.txt: status → patched restart → verdict → digest → kill → alert → restart → resolved → history."""
    steps = parse_script((ROOT / "demo" / "script.txt").read_text())
    kinds = [
        s.text.split()[0]
        if isinstance(s, Say)
        else (
            "kill"
            if isinstance(s, Kill)
            else "wait ranks"
            if isinstance(s, WaitRanks)
            else f"wait {s.kind.value}"
        )
        for s in steps
    ]
    assert kinds[:5] == ["status", "restart", "wait verdict", "wait ranks", "digest"]
    assert kinds.index("kill") < kinds.index("wait alert") < kinds.index("wait resolved")
    assert kinds[-1] == "history"
    assert any(isinstance(s, Say) and "with topk patch" in s.text for s in steps)
    texts = [s.text if isinstance(s, Say) else kinds[i] for i, s in enumerate(steps)]
    hang = texts.index("restart dflash with hang patch")  # a stuck rank, then the resuming restart
    assert texts[hang + 1 : hang + 4] == ["wait verdict", "wait alert", "restart dflash without hang patch"]


def test_directives_parse() -> None:
    """wait KIND JOB [within N] and kill JOB become typed steps; comments and blanks vanish."""
    steps = parse_script(
        "# hi\n\nwait alert dflash within 45\nWAIT digest dflash\nkill dflash\nstatus\nwait ranks dflash within 9\n"
    )
    assert steps == [
        Wait(EventKind.ALERT, "dflash", 45.0, 3),
        Wait(EventKind.DIGEST, "dflash", 120.0, 4),
        Kill("dflash", 5),
        Say("status", 6),
        WaitRanks("dflash", 9.0, 7),
    ]


@pytest.mark.parametrize(
    "line",
    [
        "wait forever dflash",
        "wait verdict",
        "wait verdict dflash within -3",
        "wait verdict dflash within soon",
        "kill",
    ],
)
def test_bad_directive_names_line(line: str) -> None:
    """A malformed directive is a usage error naming its line number."""
    with pytest.raises(UsageError) as info:
        parse_script("status\n" + line + "\n")
    assert info.value.message.startswith("demo script line 2:")
    assert info.value.exit_code == ExitCode.USAGE
