"""A team's own job: plain JSON metric lines (``{"step": i, "tokens_per_s": 900, "loss": 1.0}``, no
``role``, no ``ts``) over real SSH — the restart from step 0 says the steps it lost, a plain stop's
attempt row says who stopped it, and the digest is checked against the lines it read."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import sys
import uuid
from pathlib import Path

from handlers.reply import render_text
from handlers.views.read import attempts_command
from handlers.views.reports import digest_command
from pipeline import fmt
from pipeline.config import Config, JobConfig, WatchSettings
from pipeline.verdict import Verdict, format_line, parse_line
from tests.test_watch import open_harness

#: the team's training loop: ``steps.txt`` steps, each one plain JSON line, then it idles
LOOP = """\
import json, os, sys, time
here = os.path.dirname(os.path.abspath(__file__))
steps = int(open(os.path.join(here, "steps.txt")).read())
for i in range(steps + 1):
    print(json.dumps({"step": i, "tokens_per_s": 900, "loss": 1.0}), flush=True)
time.sleep(3600)
"""


def team_job(root: Path, token: str) -> JobConfig:
    """The loop as a configured job on host ``local`` (its output is its log, the metric file)."""
    workdir = root / "tj"
    workdir.mkdir(parents=True)
    (workdir / "loop.py").write_text(LOOP)
    return JobConfig(
        host="local",
        workdir=str(workdir),
        launch=[sys.executable, str(workdir / "loop.py"), token],
        log=str(workdir / "train.log"),
        match=re.escape(f"loop.py {token}"),
        start_window=1.0,
        stop_timeout=5,
        watch=WatchSettings(interval=0.3, stall_after=30, degraded_after=30),
        channel="CTJ",
    )


async def test_a_plain_json_job_restart_stop_and_digest(tmp_path: Path, redis_config: Config) -> None:
    """Plain JSON lines are metric lines: a restart from step 0 after step 37 says ``37 steps lost``;
    after a plain ``stop`` the stopped attempt's row says ``stopped by`` that run; the digest's
    numbers are the lines' own (900 tokens/s, loss 1.000), it says the rates are reported, and it
    has no DFlash-only rows."""
    job = team_job(tmp_path / "jobs", uuid.uuid4().hex)
    steps = Path(job.workdir) / "steps.txt"
    pids: list[int] = []
    async with open_harness(tmp_path, redis_config, {"tj": job}) as h:
        ctx = h.ctx
        try:
            steps.write_text("37")
            first = await h.launch("tj")
            pids.append(first.pid or 0)
            assert first.verdict is Verdict.RUNNING, first.verdict_line

            steps.write_text("5")
            second = await ctx.restarter.restart(await ctx.runs.create("tj", "U0TEST"))
            pids.append(second.pid or 0)
            second = await ctx.restarter.verify(second)
            line = f"RUNNING 1/1 processes pid {second.pid}, started from step 0; the previous run reached step 37 — 37 steps lost"
            assert second.verdict_line == line
            assert format_line(parse_line(line)) == line
            assert (second.previous_run, second.lost) == (first.id, 37)

            stop = await ctx.restarter.stop(await ctx.runs.create("tj", "U0TEST", action="stop"))
            assert stop.verdict is None, stop.verdict_line
            third = await h.launch("tj")
            pids.append(third.pid or 0)
            assert third.verdict is Verdict.RUNNING and third.lost is None  # a start is not compared

            reply = await attempts_command(ctx, "tj", 10)
            (table,) = reply.tables
            rows = {row[0]: row for row in table.rows}
            # run, started, resumed at, reached, steps/s, ended, steps lost (no ts: no rate)
            assert rows[first.id][3:5] == ("37", "n/a") and rows[first.id][6] == "37"
            assert rows[first.id][5].startswith(f"stopped by {second.id} (stopped ")
            assert rows[second.id][3] == "5" and rows[second.id][5].startswith(
                f"stopped by {stop.id} (stopped "
            )
            assert rows[third.id][5] == "running"

            digest = await digest_command(ctx, "tj")
            text = render_text(digest)
            assert digest.title == "digest tj: 900 tokens/s", text
            fields = dict(digest.fields)
            assert fields["loss"] == "1.000 last, 1.000 mean"
            assert not {"top-1/4/8", "queue depth", "step time p50/p95", "samples/s"} & fields.keys(), fields
            assert any("no ts: rates are their own tokens_per_s" in ln for ln in digest.lines), digest.lines
            assert digest.chart is None  # no time axis without ts
            ((rank, role, _, tps, _),) = digest.tables[0].rows
            assert (rank, role, tps) == ("0", "worker", "900")
        finally:
            for pid in filter(None, pids):
                with contextlib.suppress(OSError):
                    os.killpg(os.getpgid(pid), signal.SIGKILL)


async def test_a_digest_with_no_metric_line_says_why(tmp_path: Path, redis_config: Config) -> None:
    """40 JSON lines without ``step`` read over SSH: the digest says ``40 JSON lines, none with step``."""
    job = team_job(tmp_path / "jobs", uuid.uuid4().hex)
    log = Path(job.log)
    log.write_text("".join(json.dumps({"epoch": i, "lr": 0.1}) + "\n" for i in range(40)))
    async with open_harness(tmp_path, redis_config, {"tj": job}) as h:
        digest = await digest_command(h.ctx, "tj")
    size = fmt.size(log.stat().st_size)
    assert digest.title == "digest tj: no throughput in this window"
    assert (
        f"no metric lines for tj in the {size} read from {log} (40 JSON lines, none with step)"
        in digest.lines
    )
