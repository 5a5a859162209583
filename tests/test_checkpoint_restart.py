"""Pitstop verifies the checkpoint a restart resumes from: pre-flight's rule (pure), the verdict
line's ``checkpoint verified`` clause, ``restart JOB from step S`` and ``checkpoints JOB``; end to
end on the reference pipeline over real SSH, a checkpoint truncated after a SIGKILL refuses a
person's restart with the fix, ``from step`` resumes where asked, and an automatic restart falls
back to the newest intact checkpoint by itself."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import uuid
from pathlib import Path

import pytest

from handlers.grammar.commands import ParseError, parse
from handlers.request.auth import SYSTEM_USER
from handlers.request.dispatch import Dispatcher, Request
from handlers.watch.cycle import Watcher
from pipeline import fmt
from pipeline.config import Config, JobConfig, WatchSettings
from pipeline.config.jobs import AutoRestart
from pipeline.observe.checkpoints import Checkpoint, choose, resume_argv
from pipeline.state.runs import RunRecord
from pipeline.verdict import Verdict, VerdictLine, format_line, parse_line
from tests.fixtures.dflash import SMALLEST, dflash_job
from tests.test_watch import Harness, open_harness, until

GIB = 1024**3
RESUME = ["--resume-step", "{step}"]


def _ck(step: int, *, short: int | None = None) -> Checkpoint:
    damage = (
        None if short is None else {"why": "size", "file": "drafter.pt", "size": short, "expected": 2 * GIB}
    )
    return Checkpoint(step, 100.0, 3, 3 * GIB, damage, None if short is not None else "size")  # type: ignore[arg-type]


def _job(**kw: object) -> JobConfig:
    fields = {"host": "h", "workdir": "/w", "launch": ["./run.sh"], "log": "/w/t.log", "match": "x"}
    return JobConfig.model_validate({**fields, "checkpoint_dir": "/w/ckpt", **kw})


def test_pre_flights_rule_refuses_a_person_falls_back_for_pitstop_and_checks_from_step() -> None:
    """Damaged newest: a person is refused with the fix, Pitstop's own restart falls back (passing the
    step when the job has resume_from); ``from step S`` needs S intact and resume_from; none: unchecked."""
    found = [_ck(540, short=int(1.1 * GIB)), _ck(530), _ck(520)]
    job = _job(resume_from=RESUME)
    person = choose("dflash", job, found, None, auto=False)
    assert person.refused == (
        "checkpoint step 540 is incomplete: drafter.pt is 1.10 GiB of 2.00 GiB; fix: restart dflash from step 530"
    )
    auto = choose("dflash", job, found, None, auto=True)
    assert auto.checkpoint is found[1] and auto.pass_step == 530 and auto.refused is None
    assert auto.fell_back is not None and auto.fell_back.endswith(
        "dflash resumes from step 530, the newest intact checkpoint"
    )
    assert choose("dflash", _job(), found, None, auto=True).pass_step is None  # it finds the whole one itself
    assert choose("dflash", job, found, 520, auto=False).pass_step == 520
    assert choose("dflash", job, found, 540, auto=False).refused == (
        "step 540 has no intact checkpoint (drafter.pt is 1.10 GiB of 2.00 GiB); steps with one: 530, 520"
    )
    assert choose("dflash", job, found, 7, auto=False).refused == (
        "step 7 has no intact checkpoint; steps with one: 530, 520"
    )
    refused = choose("dflash", _job(), found, 530, auto=False).refused
    assert refused is not None and refused.startswith("dflash has no resume_from")
    assert choose("dflash", job, [], None, auto=False) == choose("dflash", job, [], None, auto=True)
    assert choose("dflash", job, [], None, auto=False).checkpoint is None
    assert choose("dflash", job, found[1:], None, auto=False).checkpoint is found[1]
    assert resume_argv(job, 530) == ["./run.sh", "--resume-step", "530"] and resume_argv(job, None) == [
        "./run.sh"
    ]


def test_resume_from_must_name_the_step() -> None:
    """``resume_from`` without ``{step}`` is a config error naming the fix."""
    with pytest.raises(ValueError, match=r"names no \{step\}"):
        _job(resume_from=["--resume"])


def test_the_verified_clause_round_trips_and_other_lines_are_unchanged() -> None:
    """``resumed at step 530 (checkpoint verified: 3 files, 2.30 GiB)`` reads back, with and without the
    lost clause; without ``verified`` the line is as before."""
    base = VerdictLine(Verdict.RUNNING, 3, 3, 4242, resumed_at=530)
    line = format_line(base.__class__(**{**base.__dict__, "verified": "3 files, 2.30 GiB"}))
    assert (
        line == "RUNNING 3/3 processes pid 4242, resumed at step 530 (checkpoint verified: 3 files, 2.30 GiB)"
    )
    assert format_line(parse_line(line)) == line and parse_line(line).verified == "3 files, 2.30 GiB"
    lost = line + "; the previous run reached step 545 — 15 steps lost"
    assert format_line(parse_line(lost)) == lost and parse_line(lost).lost == 15
    assert format_line(base) == "RUNNING 3/3 processes pid 4242, resumed at step 530"


def test_from_step_parses_as_a_clause_and_needs_resume_from(redis_config: Config) -> None:
    """``restart dflash from step 530`` (in any place among the options) carries the step; a job
    without resume_from is refused at parse time saying what to set."""
    jobs = {"dflash": _job(resume_from=RESUME, host="local"), "plain": _job(host="local")}
    hosts = {"local": {"address": "127.0.0.1"}}
    config = Config.model_validate({**redis_config.model_dump(), "hosts": hosts, "jobs": jobs})
    command = parse("restart dflash from step 530", config)
    assert command.from_step == 530 and command.text() == "restart dflash from step 530"
    assert parse("restart dflash from step 530 fresh cache", config).from_step == 530
    assert parse("checkpoints dflash", config).verb == "checkpoints"
    with pytest.raises(ParseError, match=r"needs \[jobs.plain\] resume_from"):
        parse("restart plain from step 530", config)


# --- end to end: the reference pipeline over real SSH ------------------------------------------


def _req(text: str, user: str = "U0TEST", **kw: str) -> Request:
    return Request(text=text, user=user, delivery_id=uuid.uuid4().hex, channel="C0REQUEST01", **kw)


async def _checkpoints(ckpt: Path, count: int) -> bool:
    return len([p for p in ckpt.glob("step-*/manifest.json")]) >= count


async def _ran(h: Harness, d: Dispatcher, text: str, user: str = "U0TEST", **kw: str) -> RunRecord:
    """``text`` through the dispatcher, its sequence run to its end."""
    reply = await d.handle(_req(text, user, **kw))
    assert reply.run_id is not None, reply.title
    await d.drain(60)
    return await h.ctx.runs.get(reply.run_id)


def _fact(ckpt: Path, step: int) -> str:
    """``1 file, 1.7 MiB``: what the verdict says of checkpoint ``step``, from its manifest."""
    files = json.loads((ckpt / f"step-{step:06d}" / "manifest.json").read_text())["files"]
    return f"{len(files)} file{'' if len(files) == 1 else 's'}, {fmt.size(sum(f['size'] for f in files))}"


def _steps(ckpt: Path) -> list[int]:
    return sorted((int(p.name[5:]) for p in ckpt.glob("step-*")), reverse=True)


@pytest.mark.timeout(300)
async def test_a_truncated_checkpoint_refuses_a_person_from_step_resumes_there_and_pitstop_falls_back(
    tmp_path: Path, redis_config: Config
) -> None:
    """SIGKILL, then the newest checkpoint truncated: `restart dflash` is refused at pre-flight with the
    sizes and `restart dflash from step S` (nothing stopped); `from step 5` lists the intact steps;
    the automatic restart falls back by itself and says so; `from step S` resumes at S, verified."""
    args = [*SMALLEST, "--metric-every", "5", "--checkpoint-every", "10", "--step-time", "0.05"]
    args += ["--keep-checkpoints", "10"]
    watch = WatchSettings(interval=0.5, stall_after=600, degraded_after=600, warmup=1)
    watch = watch.model_copy(update={"auto_restart": AutoRestart(max=3, within=600, backoff=0.2)})
    job = dflash_job(tmp_path / "dflash", args, 3, watch=watch, resume_from=RESUME)
    ckpt = Path(job.checkpoint_dir or "")
    async with open_harness(tmp_path, redis_config, {"dflash": job}) as h:
        ctx, sids = h.ctx, []
        d = Dispatcher(ctx, lock_ttl=10.0)
        try:
            run = await h.launch("dflash")
            assert run.verdict is Verdict.RUNNING and run.sid is not None, run.verdict_line
            sids.append(run.sid)
            assert await until(lambda: _checkpoints(ckpt, 3), 120)
            watcher = Watcher(ctx)
            await watcher.cycle("local")  # seen alive: its death is a crash
            await h.kill("dflash")
            newest, intact = _steps(ckpt)[0], _steps(ckpt)[1]
            drafter = ckpt / f"step-{newest:06d}" / "drafter.pt"
            full = drafter.stat().st_size
            os.truncate(drafter, full // 2)

            refused = await _ran(h, d, "restart dflash")
            assert refused.verdict is Verdict.PREFLIGHT_FAILED
            assert [s.step.value for s in refused.steps] == ["preflight"]  # nothing was stopped
            sizes = f"drafter.pt is {fmt.size(full // 2)} of {fmt.size(full)}"
            assert refused.verdict_line == (
                f"PREFLIGHT_FAILED checkpoint: checkpoint step {newest} is incomplete: {sizes}; "
                f"fix: restart dflash from step {intact}"
            )
            listed = await _ran(h, d, "restart dflash from step 5")
            assert listed.verdict is Verdict.PREFLIGHT_FAILED
            steps_with_one = ", ".join(str(s) for s in _steps(ckpt)[1:])
            assert (listed.verdict_line or "").endswith(
                f"step 5 has no intact checkpoint; steps with one: {steps_with_one}"
            )

            async def auto_run() -> bool:
                return any(r.requested_by == SYSTEM_USER for r in await ctx.runs.recent("dflash", 20))

            shown = [(p.kind, p.reply.title) for p in h.outbox.posted]
            assert await until(auto_run, 60, lambda: watcher.cycle("local")), shown
            await watcher.drain(60)
            [auto] = [r for r in await ctx.runs.recent("dflash", 20) if r.requested_by == SYSTEM_USER]
            assert auto.auto and auto.resume_step == intact and auto.sid is not None, auto.verdict_line
            sids.append(auto.sid)
            fallback = f"checkpoint step {newest} is incomplete: {sizes}; dflash resumes from step {intact}"
            assert auto.warning is not None and auto.warning.startswith(fallback)
            preflight = auto.steps[0]
            assert fallback in preflight.detail
            auto = await ctx.restarter.verify(await ctx.runs.get(auto.id)) if auto.verdict is None else auto
            facts = parse_line(auto.verdict_line or "")
            assert facts.verdict is Verdict.RUNNING and facts.resumed_at == intact, auto.verdict_line
            assert facts.verified == _fact(ckpt, intact), auto.verdict_line

            back = min(_steps(ckpt))
            rolled = await _ran(h, d, f"restart dflash from step {back}")
            assert rolled.sid is not None and rolled.resume_step == back, rolled.verdict_line
            sids.append(rolled.sid)
            rolled = await ctx.restarter.verify(rolled)
            facts = parse_line(rolled.verdict_line or "")
            assert facts.resumed_at == back and facts.verified == _fact(ckpt, back), rolled.verdict_line
            assert f", resumed at step {back} (checkpoint verified: {facts.verified})" in (
                rolled.verdict_line or ""
            )

            listing = await d.handle(_req("checkpoints dflash"))
            [table] = listing.tables
            assert table.rows[0][0] == str(_steps(ckpt)[0]) and all(
                r[4] == "verified (size)" for r in table.rows[:1]
            )
        finally:
            await d.drain(10)
            for sid in sids:
                with contextlib.suppress(OSError):
                    os.killpg(sid, signal.SIGKILL)
