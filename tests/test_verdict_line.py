"""The verdict line: one owner writes it and reads it back, exactly, for people and scripts."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline import verdict
from pipeline.verdict import Lost, Verdict, VerdictLine, format_line, parse_line

#: every form the engines write, built from its facts or by the builders they call
LINES = [
    (str(VerdictLine(Verdict.RUNNING, 8, 8, 4242)), "RUNNING 8/8 processes pid 4242"),
    (
        str(VerdictLine(Verdict.RUNNING, 8, 8, 4242, resumed_at=12000)),
        "RUNNING 8/8 processes pid 4242, resumed at step 12000",
    ),
    (
        str(VerdictLine(Verdict.RUNNING, 8, 8, 4242, ignored_checkpoint=12000)),
        "RUNNING 8/8 processes pid 4242, started from step 0 although checkpoint step 12000 exists",
    ),
    (
        str(verdict.VerdictLine(verdict.Verdict.RUNNING, 8, 8, job_id=4242, nodes=2)),
        "RUNNING 8/8 processes job 4242 on 2 nodes",
    ),
    (
        str(verdict.VerdictLine(verdict.Verdict.RUNNING, 4, 4, job_id=7, nodes=1)),
        "RUNNING 4/4 processes job 7 on 1 node",
    ),
    (
        format_line(
            Lost(1004, 533, "drafter", 250.0, "00:32:01 UTC").on(
                VerdictLine(Verdict.RUNNING, 8, 8, job_id=4242, nodes=2, resumed_at=471)
            )
        ),
        "RUNNING 8/8 processes job 4242 on 2 nodes, resumed at step 471; the previous run reached drafter "
        "step 1,004 — 533 drafter steps (about 4 min of training) lost since the checkpoint of 00:32:01 UTC",
    ),
    (
        format_line(VerdictLine(Verdict.RUNNING, 8, 8, job_id=7, nodes=2, ignored_checkpoint=30)),
        "RUNNING 8/8 processes job 7 on 2 nodes, started from step 0 although checkpoint step 30 exists",
    ),
    (
        str(VerdictLine(Verdict.PENDING, job_id=4242, reason="Resources", queued_s=125)),
        "PENDING reason Resources (job 4242 queued 2 min)",
    ),
    (
        str(VerdictLine(Verdict.PENDING, job_id=7, reason="", queued_s=12)),
        "PENDING reason None (job 7 queued 12 s)",
    ),
    (
        str(VerdictLine(Verdict.PENDING, job_id=7, reason="Priority", queued_s=3900)),
        "PENDING reason Priority (job 7 queued 1 h 5 min)",
    ),
    (str(VerdictLine(Verdict.WRONG_COUNT, 5, 8, 4242)), "WRONG_COUNT 5/8 processes pid 4242"),
    (
        str(VerdictLine(Verdict.WRONG_COUNT, 7, 8, job_id=4242, detail="n2: 3/4, n3: no answer")),
        "WRONG_COUNT 7/8 processes job 4242 (n2: 3/4, n3: no answer)",
    ),
    (
        str(VerdictLine(Verdict.NO_PROGRESS, 8, 8, 4242, silent_s=60.2)),
        "NO_PROGRESS 8/8 processes pid 4242 log silent 60 s",
    ),
    (str(VerdictLine(Verdict.EXITED, code=3, after_s=1.23)), "EXITED code 3 after 1.2 s"),
    (str(VerdictLine(Verdict.EXITED, signal="SIGKILL", after_s=1.2)), "EXITED signal SIGKILL after 1.2 s"),
    (str(VerdictLine(Verdict.EXITED, after_s=0.04)), "EXITED after 0.0 s (exit code unknown)"),
    (
        str(VerdictLine(Verdict.ERROR_IN_LOG, pid=4242, detail="RuntimeError: CUDA out of memory")),
        "ERROR_IN_LOG pid 4242: RuntimeError: CUDA out of memory",
    ),
    (str(VerdictLine(Verdict.ERROR_IN_LOG, job_id=9, detail="x" * 300)), "ERROR_IN_LOG job 9: " + "x" * 200),
    (
        verdict.preflight_failed("patch", "topk does not apply: hunk 2 failed"),
        "PREFLIGHT_FAILED patch: topk does not apply: hunk 2 failed",
    ),
    (
        verdict.stop_failed([4242, 4243], "survived SIGKILL"),
        "STOP_FAILED survivors pid 4242, 4243: survived SIGKILL",
    ),
    (verdict.stop_failed([], "on gpu1: connection lost"), "STOP_FAILED: on gpu1: connection lost"),
    (verdict.stop_failed([], ""), "STOP_FAILED"),
    (
        verdict.launch_failed("cannot start ./run.sh: no such file"),
        "LAUNCH_FAILED cannot start ./run.sh: no such file",
    ),
    (
        str(VerdictLine(Verdict.STALE_RECORD, pid=4242, then=parse_line("RUNNING 8/8 processes pid 5000"))),
        "STALE_RECORD pid 4242 not signalled (start time differs); then: RUNNING 8/8 processes pid 5000",
    ),
    (verdict.cancelled(None), "CANCELLED before stop - nothing was changed"),
    (verdict.cancelled("patch"), "CANCELLED after patch - the job is stopped and was not relaunched"),
    (
        verdict.interrupted("stop", "the old run (pid 4242) is still alive, 8/8 processes"),
        "INTERRUPTED during stop: the old run (pid 4242) is still alive, 8/8 processes",
    ),
    (verdict.interrupted(None), "INTERRUPTED during start - Pitstop stopped before the sequence finished"),
    (
        verdict.interrupted_after_launch("alive", 8, 8, pid=5151),
        "INTERRUPTED after launch: pid 5151 running 8/8 (unverified)",
    ),
    (
        verdict.interrupted_after_launch("gone", 0, 8, pid=5151),
        "INTERRUPTED after launch: pid 5151 gone, 0/8 (unverified)",
    ),
    (
        verdict.interrupted_after_launch("unknown", 0, 8, pid=5151),
        "INTERRUPTED after launch: pid 5151 state unknown (unverified)",
    ),
    (
        verdict.interrupted_after_launch("alive", 8, 8, job_id=42),
        "INTERRUPTED after launch: job 42 running 8/8 (unverified)",
    ),
    (
        verdict.interrupted_after_launch("pending", 0, 8, job_id=42),
        "INTERRUPTED after launch: job 42 pending (unverified)",
    ),
]


@pytest.mark.parametrize(("built", "expected"), LINES, ids=[e for _, e in LINES])
def test_each_form_is_written_and_read_back_exactly(built: str, expected: str) -> None:
    """Each builder writes the documented line, and parsing it then writing it again gives the same line."""
    assert built == expected
    parsed = parse_line(built)
    assert format_line(parsed) == built
    assert parsed.verdict is Verdict(built.split(" ", 1)[0].rstrip(":"))


def test_every_verdict_has_a_documented_form() -> None:
    """The forms above cover the whole closed verdict set."""
    assert {parse_line(line).verdict for line, _ in LINES} == set(Verdict)


def test_parsed_facts_are_the_ones_written() -> None:
    """A script reads the numbers back: counts, pid or job id, resume step, exit code, survivors, nested then."""
    assert parse_line("RUNNING 8/8 processes pid 4242, resumed at step 12000") == VerdictLine(
        Verdict.RUNNING, seen=8, expected=8, pid=4242, resumed_at=12000
    )
    assert parse_line("RUNNING 8/8 processes job 42 on 2 nodes").nodes == 2
    slurm = parse_line("RUNNING 8/8 processes job 42 on 2 nodes, resumed at step 30; the previous run "
                       "reached drafter step 37 — 7 drafter steps lost")  # fmt: skip
    assert (slurm.job_id, slurm.nodes, slurm.resumed_at, slurm.reached, slurm.lost) == (42, 2, 30, 37, 7)
    assert parse_line("EXITED code 3 after 1.2 s").code == 3
    assert parse_line("PENDING reason Resources (job 4242 queued 2 min)").queued_s == 120.0
    assert parse_line("STOP_FAILED survivors pid 1, 2: x").survivors == (1, 2)
    stale = parse_line(
        "STALE_RECORD pid 4242 not signalled (start time differs); then: EXITED code 1 after 2.0 s"
    )
    assert stale.pid == 4242 and stale.then is not None and stale.then.code == 1


@pytest.mark.parametrize(
    "text",
    ["", "running 8/8 processes pid 1", "RUNNING eight processes", "OK fine", "EXITED code x after 1 s"],
)
def test_what_is_not_a_verdict_line_is_refused(text: str) -> None:
    """Anything else raises ValueError naming the text, never a half-filled VerdictLine."""
    with pytest.raises(ValueError, match="verdict line"):
        parse_line(text)


@given(
    seen=st.integers(0, 10_000),
    expected=st.integers(1, 10_000),
    pid=st.integers(1, 4_194_304),
    resumed=st.none() | st.integers(1, 10**9),
)
def test_running_lines_round_trip_for_any_numbers(
    seen: int, expected: int, pid: int, resumed: int | None
) -> None:
    """Any counts, pid and resume step survive a write and a read."""
    line = str(VerdictLine(Verdict.RUNNING, seen, expected, pid, resumed_at=resumed))
    assert parse_line(line) == VerdictLine(Verdict.RUNNING, seen, expected, pid=pid, resumed_at=resumed)


@given(detail=st.text(st.characters(blacklist_categories=("Cs",)), max_size=80))
def test_free_text_details_round_trip(detail: str) -> None:
    """Any detail (colons, line breaks, trailing spaces, empty) is written on one line and read back whole."""
    for line in (
        verdict.launch_failed(detail),
        verdict.preflight_failed("disk", detail),
        verdict.stop_failed([7], detail),
        str(VerdictLine(Verdict.ERROR_IN_LOG, pid=3, detail=detail)),
        verdict.interrupted("stop", detail),
        str(VerdictLine(Verdict.WRONG_COUNT, 1, 2, job_id=5, detail=detail)),
        str(VerdictLine(Verdict.PENDING, job_id=9, reason=detail, queued_s=30)),
    ):
        assert "\n" not in line and line == line.strip()
        assert format_line(parse_line(line)) == line
    assert parse_line(verdict.launch_failed(detail)).detail == verdict.one_line(detail)


@given(
    code=st.none() | st.integers(-255, 255),
    signal=st.none() | st.sampled_from(["SIGKILL", "SIGTERM", "SIGSEGV"]),
    seconds=st.floats(min_value=-1e9, max_value=1e9) | st.sampled_from([math.nan, math.inf, -math.inf]),
    pid=st.integers(1, 4_194_304),
)
def test_odd_seconds_never_make_an_unreadable_line(
    code: int | None, signal: str | None, seconds: float, pid: int
) -> None:
    """A host clock stepped back (negative seconds) or a NaN is shown as 0, and the line still reads back,
    also nested in a STALE_RECORD line."""
    for line in (
        str(VerdictLine(Verdict.EXITED, code=code, signal=signal, after_s=seconds)),
        str(VerdictLine(Verdict.NO_PROGRESS, 8, 8, pid, silent_s=seconds)),
        str(VerdictLine(Verdict.PENDING, job_id=pid, reason="Resources", queued_s=seconds)),
    ):
        assert format_line(parse_line(line)) == line
        stale = str(VerdictLine(Verdict.STALE_RECORD, pid=pid, then=parse_line(line)))
        assert format_line(parse_line(stale)) == stale


def test_slurm_reasons_with_spaces_read_back() -> None:
    """squeue's reason may hold spaces and brackets: the PENDING line still reads back."""
    line = str(
        VerdictLine(
            Verdict.PENDING, job_id=4242, reason="ReqNodeNotAvail, UnavailableNodes:n[01-02]", queued_s=120
        )
    )
    assert parse_line(line).reason == "ReqNodeNotAvail, UnavailableNodes:n[01-02]"
    assert format_line(parse_line(line)) == line


@pytest.mark.parametrize(
    "text",
    ["RUNNING 1/1 processes pid 1 on 2 nodes", "RUNNING 1/1 processes job 5", "RUNNING ٨/٨ processes pid 1"],
)
def test_forms_no_builder_writes_are_refused(text: str) -> None:
    """A node count needs a Slurm job, a Slurm job needs its node count, digits are ASCII."""
    with pytest.raises(ValueError, match="verdict line"):
        parse_line(text)
