"""The two-person rule in the console: one person asks, a second types `approve r-N` in their own
session and the restart runs in that process with the approved hash; the requester's own approval is
refused; `pending`, `history` and `patches` show the record."""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import AsyncIterator

import pytest
from rich.console import Console

from bot.console.chat import ConsoleOutbox, ConsoleSession, make_console
from bot.console.identity import cli_identity
from bot.console.say import say_main
from bot.runtime.assembly import build_context, close_context
from bot.runtime.scheduler import PitstopScheduler
from handlers.context import Context
from handlers.request.dispatch import Dispatcher
from pipeline.config import ApprovalSettings, Config
from pipeline.errors import ExitCode
from pipeline.verdict import Verdict
from tests.fixtures.slack import kill_matching, slack_config
from tests.fixtures.ssh import InProcessHost, JobFactory, JobSetup
from tests.support_handlers import wait_until
from tests.test_restart import TOPK_DIFF

SHA = hashlib.sha256(TOPK_DIFF.encode()).hexdigest()
MAYA, LEE, KIM = "U0MAYA", "U0LEE", "U0KIM"
#: [auth.cli]: the OS users of the sessions (given by name here; tests/test_cli_identity.py runs real ones)
CLI = {"maya": MAYA, "lee": LEE, "kim": KIM}


def _mapped(config: Config) -> Config:
    """``config`` with :data:`CLI` as its ``[auth.cli]``."""
    return config.model_copy(update={"auth": config.auth.model_copy(update={"cli": CLI})})


@pytest.fixture
async def parts(
    redis_config: Config, ssh_server: InProcessHost, job_factory: JobFactory
) -> AsyncIterator[tuple[Context, Dispatcher, Console, JobSetup]]:
    """The console's parts on real Redis and SSH; the job's patched restarts wait for an admin."""
    setup = job_factory(ssh_server, patches={"topk": TOPK_DIFF})
    setup = setup.with_job(approval=ApprovalSettings(actions=["restart_with_patch"], approvers=["admin"]))
    config = _mapped(slack_config(setup.config, redis_config, operators=(MAYA,), admins=(LEE, KIM)))
    console = make_console(file=io.StringIO(), record=True, width=200)
    ctx = await build_context(config, ConsoleOutbox(console))
    dispatcher = Dispatcher(ctx)
    try:
        yield ctx, dispatcher, console, setup
    finally:
        await dispatcher.drain(30)
        await close_context(ctx)
        kill_matching(setup.token)


async def test_console_request_approved_by_a_second_session(
    parts: tuple[Context, Dispatcher, Console, JobSetup],
) -> None:
    """maya asks; lee (admin) cannot approve his own but approves maya's from his session; it runs
    with the approved hash, verified; pending, history and patches show the record."""
    ctx, dispatcher, console, setup = parts
    maya = ConsoleSession(dispatcher, who=cli_identity(ctx.config, "maya"), console=console)
    lee = ConsoleSession(dispatcher, who=cli_identity(ctx.config, "lee"), console=console)
    asked = await maya.run_line(f"restart {setup.name} with topk patch")
    assert asked.exit_code is ExitCode.AWAITING_APPROVAL and asked.thread_key is not None
    rid = asked.thread_key.removeprefix("run:")
    shown = console.export_text(clear=False)
    assert "waiting for approval" in shown and SHA[:12] in shown and "[Approve] (approve)" in shown
    assert "attached: " in shown and f"sha256 {SHA}" in "".join(shown.split("\n"))
    pending = await lee.run_line("pending")
    assert rid in pending.lines[0] and MAYA in pending.lines[0]
    own = await maya.run_line(f"approve {rid}")
    assert own.exit_code is ExitCode.DENIED
    done = await lee.run_line(f"approve {rid}")
    assert done.run_id == rid and done.exit_code is ExitCode.OK

    async def verified() -> bool:
        return (await ctx.runs.get(rid)).verdict is not None

    await dispatcher.drain(60)
    sched = PitstopScheduler(ctx)  # the verdict comes from the verification queue
    await sched.start()
    try:
        await wait_until(verified, timeout=60)
    finally:
        await sched.stop()
    run = await ctx.runs.get(rid)
    assert run.verdict is Verdict.RUNNING and run.approved_by == LEE and run.approved_patches == {"topk": SHA}
    history = await lee.run_line(f"history {setup.name}")
    (approvals,) = [f for f in history.follow_ups if "two-person rule" in f.title]
    rows = approvals.tables[0].rows
    assert any(r[1] == rid and r[3] == "approved" and SHA[:12] in r[4] and MAYA in r[4] for r in rows)
    assert any(r[3] == "awaiting_approval" for r in rows)
    assert history.tables[0].rows[0][2] == f"<@{MAYA}> (console: maya) + <@{LEE}> (console: lee)"
    patches = await lee.run_line(f"patches {setup.name}")
    assert ("sha256", f"topk {SHA[:12]}") in patches.fields


async def test_say_asks_then_a_second_process_approves_and_waits(
    redis_config: Config, ssh_server: InProcessHost, job_factory: JobFactory
) -> None:
    """`pitstop say` as three processes: the request exits 7 at once, the requester's own approval
    exits 3, and a second person's `approve r-N --wait` runs it there and exits 0 with the verdict."""
    setup = job_factory(ssh_server, patches={"topk": TOPK_DIFF})
    setup = setup.with_job(approval=ApprovalSettings(actions=["restart_with_patch"], approvers=["admin"]))
    config = _mapped(slack_config(setup.config, redis_config, operators=(MAYA,), admins=(LEE,)))
    err = io.StringIO()
    try:
        out = io.StringIO()
        code = await say_main(
            config,
            f"restart {setup.name} with topk patch",
            who=cli_identity(config, "maya"),
            wait=True,
            as_json=False,
            out=out,
            err=err,
        )
        assert code == ExitCode.AWAITING_APPROVAL, out.getvalue()
        rid = out.getvalue().split(":", 1)[0]
        out = io.StringIO()
        own = await say_main(
            config,
            f"approve {rid}",
            who=cli_identity(config, "maya"),
            wait=True,
            as_json=False,
            out=out,
            err=err,
        )
        assert own == ExitCode.DENIED and "cannot approve it" in out.getvalue()
        out = io.StringIO()
        code = await say_main(
            config,
            f"approve {rid}",
            who=cli_identity(config, "lee"),
            wait=True,
            as_json=True,
            out=out,
            err=err,
        )
        assert code == 0, out.getvalue() + err.getvalue()
        data = json.loads(out.getvalue())
        assert data["run_id"] == rid and data["follow_ups"][-1]["title"].startswith("RUNNING 1/1 processes")
    finally:
        kill_matching(setup.token)
