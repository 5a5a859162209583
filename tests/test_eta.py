"""ETA and attempts: digests say step, percent done and the ETA at the current rate; ``history JOB
--attempts`` and the digest's footer show one row per attempt."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from pathlib import Path

import pytest

from handlers.grammar.commands import parse
from handlers.request.verbs import VERBS
from handlers.text import ATTEMPT_HEADERS, digest_progress
from handlers.views.read import attempt_rows
from handlers.views.reports import digest_command
from pipeline.config import Config
from pipeline.observe.attempts import TrainingProgress, progress_toward
from pipeline.observe.metrics import MetricLine
from pipeline.state.runs import Reach, RunRecord
from tests.fixtures.dflash import SMALLEST, dflash_job
from tests.support_handlers import handler_config
from tests.test_attempts import _verified
from tests.test_watch import open_harness

#: the reference pipeline held to a steady pace: each step of every rank takes PACE s
PACE = 0.4


def test_progress_is_the_pipeline_roles_step_and_rate() -> None:
    """Drafters' step (targets count apart), share done, ETA = steps left / current steps/s."""
    lines = [MetricLine(ts=100.0 + s, role="drafter", rank=5, step=10 * s) for s in range(1, 11)]
    lines += [MetricLine(ts=100.0 + s, role="target", rank=0, step=999) for s in range(1, 3)]
    p = progress_toward(lines, 1000)
    assert p == TrainingProgress(100, 1000, "drafter", 10.0)
    assert p.fraction == pytest.approx(0.1) and p.eta_s == pytest.approx(90.0)
    assert digest_progress(p) == "drafter step 100 of 1,000 (10.0 %), ETA 1 min at 10.00 steps/s"
    assert digest_progress(TrainingProgress(1000, 1000, None, None)) == "step 1,000 of 1,000 (100.0 %), done"
    assert progress_toward([MetricLine(ts=1.0, role="drafter", rank=5)], 10) is None


def test_history_attempts_parses_and_shows_one_row_per_attempt() -> None:
    """``history JOB --attempts``: started, resumed at, reached, steps/s, how it ended, steps lost."""
    cmd = parse("history dflash --attempts", handler_config())
    assert cmd.attempts and cmd.text() == "history dflash 10 --attempts" and "history" in VERBS
    assert not parse("history dflash", handler_config()).attempts
    first = RunRecord(
        id="r-1", job="dflash", requested_by="u", created_at=1.0, launched_at=1_796_000_000.0, resumed_at=0,
        reach=Reach(steps={"drafter": 1004}, role="drafter", step=1004, steps_per_s=2.5, ended="host_oom"),
    )  # fmt: skip
    second = RunRecord(
        id="r-2", job="dflash", requested_by="u", created_at=2.0, launched_at=1_796_000_600.0,
        resumed_at=471, previous_run="r-1", lost=533,
    )  # fmt: skip
    rows = attempt_rows([second, first], "UTC", live="r-2")
    assert ATTEMPT_HEADERS == ("run", "started", "resumed at", "reached", "steps/s", "ended", "steps lost")
    assert rows[0][0] == "r-2" and rows[0][2:] == ("471", "n/a", "n/a", "running", "n/a")
    assert rows[1][0] == "r-1" and rows[1][2:] == ("0", "1,004", "2.50", "host_oom", "533")


@pytest.mark.timeout(300)
async def test_eta_of_a_steady_run_is_within_ten_percent(tmp_path: Path, redis_config: Config) -> None:
    """With total_steps, a digest of the reference pipeline held to a fixed step time (``--step-time``;
    real processes, real SSH) says the drafters' step, percent done and an ETA within 10 % of the truth
    from the pace (steps left × step time); its footer lists the attempt."""
    total = 60
    args = [*SMALLEST, "--metric-every", "2", "--step-time", str(PACE), "--max-steps", str(total)]
    job = dflash_job(tmp_path / "dflash", args, 3, total_steps=total)
    async with open_harness(tmp_path, redis_config, {"dflash": job}) as h:
        ctx, run = h.ctx, None
        try:
            run = await h.launch("dflash", verify=False)
            run = await _verified(ctx, run)
            await _until_step(Path(job.log), 16)
            reply = await digest_command(ctx, "dflash")
            field = dict(reply.fields)["progress"]
            assert field.startswith("drafter step ") and f" of {total} (" in field, field
            seen, eta = _eta(field)
            truth = (total - seen) * PACE
            assert seen < total and abs(eta - truth) <= 0.10 * truth, (field, truth)
            footer = reply.tables[-1]
            assert (
                footer.headers == ATTEMPT_HEADERS
                and footer.rows[0][0] == run.id
                and footer.rows[0][5] == "running"
            )
        finally:
            if run is not None and run.sid is not None:
                with contextlib.suppress(OSError):
                    os.killpg(run.sid, signal.SIGKILL)


def _eta(field: str) -> tuple[int, float]:
    """The step of a progress field (``drafter step 111 of 400 (…), ETA 14 s at 20.00 steps/s``) and its
    ETA in seconds from that step, from its rate (the duration shown is rounded to whole seconds)."""
    step = int(field.split(" of ")[0].rsplit(" ", 1)[1].replace(",", ""))
    total = int(field.split(" of ")[1].split(" ")[0].replace(",", ""))
    rate = float(field.rsplit(" at ", 1)[1].split(" ")[0])
    return step, (total - step) / rate


async def _until_step(log: Path, step: int, timeout: float = 60.0) -> None:
    """Wait (bounded) until the log holds drafter step ``step``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for raw in log.read_bytes().splitlines()[-20:] if log.exists() else []:
            if raw.startswith(b"{") and b'"drafter"' in raw and json.loads(raw)["step"] >= step:
                return
        await asyncio.sleep(0.05)
    raise AssertionError(f"step {step} not reached")
