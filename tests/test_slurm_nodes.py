"""Slurm nodes as first-class things on the real three-node cluster: ``nodes``, ``drain``/``undrain``
(admin, audited, announced, under the two-person rule when the job asks) and ``restart … excluding``,
through the dispatcher, from Slack (Bolt, the strict fake) and from the ``pitstop say`` CLI."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from handlers.grammar.commands import ParseError, parse
from handlers.outbox import MemoryOutbox
from handlers.reply import Reply
from handlers.request.dispatch import Dispatcher, Request
from pipeline import verdict
from pipeline.config import ApprovalSettings, AuthSettings, Config, JobConfig, SlackSettings
from pipeline.errors import ExitCode
from pipeline.host.slurm import parse_nodes
from pipeline.verdict import Verdict
from tests.test_slurm import (  # noqa: F401 (fixtures)
    MakeSlurm,
    SlurmStack,
    context,
    make_slurm,
    recheck_until_decided,
    redis_handle,
    shared_redis_url,
)
from tests.test_slurm_dispatch import Serve, serve  # noqa: F401 (fixtures)

ROOT = Path(__file__).resolve().parent.parent
ADMIN, OTHER_ADMIN, OPERATOR = "U0ADMIN1", "U0ADMIN2", "U0OPERATOR1"
CHANNEL = "C0TRAINER"


def _config(stack: SlurmStack, **job: Any) -> Config:
    """The stack's config with roles, the job's channel and ``job``'s fields."""
    jobs = {stack.name: stack.job.model_copy(update={"channel": CHANNEL, **job})}
    auth = AuthSettings(admins=[ADMIN, OTHER_ADMIN], operators=[OPERATOR], viewers=["*"])
    return stack.config.model_copy(update={"jobs": jobs, "auth": auth, "slack": SlackSettings(pace=0)})


def _dispatcher(stack: SlurmStack, outbox: MemoryOutbox, **job: Any) -> Dispatcher:
    stack.config = _config(stack, **job)
    stack.restarter.config = stack.config
    ctx = context(stack, outbox)
    return Dispatcher(ctx)


def _row(reply: Reply, node: str) -> tuple[str, ...]:
    return next(r for t in reply.tables for r in t.rows if r[0] == node)


# --- no cluster needed ------------------------------------------------------------------------------


def _two_clusters() -> Config:
    job = {"engine": "slurm", "slurm": {"script": "/s"}, "workdir": "/w", "log": "/l", "match": "m"}
    return Config(
        hosts={
            "login": {"address": "127.0.0.1"},
            "login2": {"address": "127.0.0.2"},
            "gpu": {"address": "h"},
        },
        jobs={
            "trainer": JobConfig(host="login", **job),
            "eagle": JobConfig(host="login2", **job),
            "local": JobConfig(host="gpu", workdir="/w", log="/l", match="m"),
        },
    )


def test_node_verbs_parse_with_their_job_where_it_is_known() -> None:
    """`drain NODE REASON [on JOB]`, `undrain`, `nodes [JOB|HOST]`, `restart … excluding` parse; a
    node verb without `on JOB` over several clusters is left for the dispatcher; bad input is named."""
    config = _two_clusters()
    drain = parse("drain n2 ECC errors on GPU 3 on eagle", config)
    assert (drain.job, drain.node, drain.reason) == ("eagle", "n2", "ECC errors on GPU 3")
    assert drain.text() == "drain n2 ECC errors on GPU 3 on eagle"
    assert parse("undrain n2", config).job is None  # two clusters: asked at dispatch
    assert (parse("nodes login2", config).host, parse("nodes eagle", config).job) == ("login2", "eagle")
    restart = parse("restart trainer excluding n2, n3", config)
    assert restart.exclude == ("n2", "n3") and restart.text() == "restart trainer excluding n2,n3"
    assert parse("restart trainer --exclude n2 --exclude n3", config).exclude == ("n2", "n3")
    with pytest.raises(ParseError, match="local is not a Slurm job"):
        parse("restart local excluding n2", config)
    with pytest.raises(ParseError, match="local is not a Slurm job"):
        parse("undrain n2 on local", config)
    with pytest.raises(ParseError, match=r"unknown job or host 'logn2' .*did you mean 'login2'"):
        parse("nodes logn2", config)
    with pytest.raises(ParseError, match='usage: drain NODE "REASON"'):
        parse("drain n2", config)


def test_nodes_reads_state_reason_and_jobs_as_slurm_shows_them() -> None:
    """scontrol's State (`MIXED+DRAIN`), sinfo's `%t` (`drng`, once per node though listed per
    partition), the reason without its `[user@time]`, and the running jobs per node."""
    text = (
        "NodeName=n1 Arch=x86_64 CPUTot=8 State=MIXED ThreadsPerCore=1 Partitions=debug,low\n"
        "NodeName=n2 Arch=x86_64 OS=Linux 6.1 #1 SMP  State=MIXED+DRAIN Partitions=debug"
        " Reason=bad ECC on GPU 3 [root@2026-12-04T18:22:22]\n"
        "@@sinfo\nn1|mix\nn2|drng\nn1|mix\nn2|drng\n@@squeue\n12|n[1-2]\n13|n2\n"
    )
    n1, n2 = parse_nodes(text)
    assert (n1.name, n1.state, n1.short, n1.reason, n1.jobs) == ("n1", "MIXED", "mix", "", (12,))
    assert (n2.state, n2.short, n2.reason, n2.jobs) == ("MIXED+DRAIN", "drng", "bad ECC on GPU 3", (12, 13))


# --- on the cluster -----------------------------------------------------------------------------


async def test_drain_and_undrain_are_admin_verbs_recorded_announced_and_shown_by_nodes(
    make_slurm: MakeSlurm,  # noqa: F811
) -> None:
    """An admin drains n2 under the running job: Slurm shows MIXED+DRAIN/drng with the reason,
    `nodes` names the job on it and who drained it, the job's channel is told, the audit keeps it;
    an operator may not; an unknown node gets did-you-mean; undrain returns it."""
    stack = await make_slurm()
    await stack.start()
    outbox = MemoryOutbox()
    dispatcher = _dispatcher(stack, outbox)

    denied = await dispatcher.handle(Request("drain n2 bad ECC", OPERATOR))
    assert denied.exit_code is ExitCode.DENIED, denied.title
    typo = await dispatcher.handle(Request("drain nn2 bad ECC", ADMIN))
    assert typo.exit_code is ExitCode.USAGE and "did you mean 'n2'" in typo.title, typo.title

    drained = await dispatcher.handle(Request("drain n2 bad ECC on GPU 3", ADMIN))
    assert drained.exit_code is ExitCode.OK, drained.title
    assert drained.title == "drained n2 on the cluster of trainer: now MIXED+DRAIN (bad ECC on GPU 3)"
    assert stack.cluster.unhealthy() == {"n2": "drng: bad ECC on GPU 3"}
    (told,) = outbox.of("post")
    assert (told.channel, told.reply.title) == (
        CHANNEL,
        f"<@{ADMIN}> drained Slurm node n2 (cluster of trainer): bad ECC on GPU 3",
    )
    listed = await dispatcher.handle(Request("nodes trainer", OPERATOR))
    assert listed.exit_code is ExitCode.OK and listed.title.endswith(": 3"), listed.title
    _, state, short, reason, jobs, held = _row(listed, "n2")
    assert (state, short, reason, jobs) == ("MIXED+DRAIN", "drng", "bad ECC on GPU 3", "trainer")
    assert held.startswith(f"drained by <@{ADMIN}> at ") and held.endswith(": bad ECC on GPU 3"), held
    assert _row(listed, "n3")[1:] == ("IDLE", "idle", "-", "-", "-")

    undrained = await dispatcher.handle(Request("undrain n2", ADMIN))
    # the controller pings the node again: ``MIXED+NOT_RESPONDING`` for a moment, as Slurm shows it
    assert undrained.title.startswith("undrained n2 on the cluster of trainer: now MIXED"), undrained.title
    assert stack.cluster.unhealthy() == {}
    assert _row(await dispatcher.handle(Request("nodes", OPERATOR)), "n2")[3:] == ("-", "trainer", "-")
    audited = [(e.user, e.verb, e.outcome.value) for e in await dispatcher.audit.recent(count=10)]
    assert (ADMIN, "drain", "accepted") in audited and (ADMIN, "undrain", "accepted") in audited, audited
    assert (OPERATOR, "drain", "denied") in audited, audited


async def test_a_drain_the_job_holds_under_the_two_person_rule_waits_for_a_second_admin(
    make_slurm: MakeSlurm,  # noqa: F811
) -> None:
    """`actions = ["drain"]`: the drain waits (exit 7), nothing drained; another admin approves and
    the node is drained, as the requester asked."""
    stack = await make_slurm(nodes=1, tasks_per_node=1)
    approval = ApprovalSettings(actions=["drain"], approvers=["admin"])
    dispatcher = _dispatcher(stack, MemoryOutbox(), approval=approval)
    waiting = await dispatcher.handle(Request("drain n3 flaky NIC", ADMIN))
    assert waiting.exit_code is ExitCode.AWAITING_APPROVAL, waiting.title
    assert stack.cluster.unhealthy() == {}
    assert waiting.title.startswith("r-1: `drain n3 flaky NIC on trainer` waits"), waiting.title
    approved = await dispatcher.handle(Request("approve r-1", OTHER_ADMIN))
    assert approved.title == "drained n3 on the cluster of trainer: now IDLE+DRAIN (flaky NIC)", (
        approved.title
    )
    assert stack.cluster.unhealthy() == {"n3": "drain: flaky NIC"}
    assert (await dispatcher.handle(Request("undrain n3", ADMIN))).exit_code is ExitCode.AWAITING_APPROVAL
    stack.cluster.run("scontrol", "update", "nodename=n3", "state=resume")


async def test_restart_excluding_a_node_relaunches_elsewhere_and_the_verdict_names_the_nodes(
    serve: Serve,  # noqa: F811
) -> None:
    """From Slack: `restart trainer excluding n1` submits with --exclude; the verdict line names
    the nodes the job now runs on; `nodes` and `drain`/`undrain` answer in Slack too."""
    served = await serve(admins=(ADMIN,))
    answer = await served.command("restart trainer excluding n1")
    assert answer.startswith("queued run r-1"), answer
    await served.thread("r-1", 2)
    run = await served.runtime.ctx.runs.get("r-1")
    assert run.verdict is Verdict.RUNNING, (run.verdict_line, run.evidence)
    assert run.verdict_line == f"RUNNING 8/8 processes job {run.slurm_job} on 2 nodes (n2, n3)"
    assert verdict.parse_line(run.verdict_line).nodelist == ("n2", "n3")
    launch = next(s for s in run.steps if s.step.value == "launch")
    assert "excluding n1" in launch.detail, launch.detail

    drained = await served.command("drain n2 bad ECC", user=ADMIN)
    assert drained == "drained n2 on the cluster of trainer: now MIXED+DRAIN (bad ECC)", drained
    response_url = served.fake.response_url()
    await served.command("nodes", user=OPERATOR)
    calls = await served.fake.wait_for("response_url", 3)
    shown = json.dumps(calls[-1].args)
    assert "MIXED+DRAIN" in shown and "drng" in shown and "bad ECC" in shown, shown
    assert response_url  # each command has its own response_url
    assert (await served.command("undrain n2", user=ADMIN)).startswith("undrained n2"), drained
    assert served.stack.cluster.unhealthy() == {}


def _toml(value: Any) -> str:
    return json.dumps(str(value) if isinstance(value, Path) else value)


def _tables(head: str, data: dict[str, Any]) -> list[str]:
    """``data`` as the TOML table ``head`` and its sub-tables (None left out)."""
    plain = [f"{k} = {_toml(v)}" for k, v in data.items() if v is not None and not isinstance(v, dict)]
    subs = [line for k, v in data.items() if isinstance(v, dict) for line in _tables(f"{head}.{k}", v)]
    return [f"[{head}]", *plain, *subs]


async def test_nodes_and_undrain_from_the_cli(
    make_slurm: MakeSlurm,  # noqa: F811
    redis_config: Config,
    tmp_path: Path,
) -> None:
    """`pitstop say "nodes trainer"` prints Slurm's states; `pitstop say "undrain n3" --as ADMIN`
    returns a drained node (exit 0), an operator's is refused (exit 3)."""
    stack = await make_slurm(nodes=1, tasks_per_node=1)
    stack.cluster.run("scontrol", "update", "nodename=n3", "state=drain", "reason=by hand")
    host = stack.config.hosts["login"].model_dump(mode="json", exclude_defaults=True)
    job = stack.job.model_dump(mode="json", exclude_defaults=True)
    lines = [
        *_tables("auth", {"admins": [ADMIN], "operators": [OPERATOR], "viewers": ["*"]}),
        *_tables("redis", {"prefix": redis_config.redis.prefix, "url": redis_config.redis.url}),
        *_tables("state", {"dir": str(redis_config.state.dir)}),
        *_tables("hosts.login", host),
        *_tables(f"jobs.{stack.name}", job),
    ]
    path = tmp_path / "pitstop.toml"
    path.write_text("\n".join(lines) + "\n")

    async def say(text: str, user: str) -> tuple[int, str]:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bot.cli", "say", text, "--as", user, "--config", str(path),
            cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        out, _ = await asyncio.wait_for(proc.communicate(), 60)
        return proc.returncode or 0, out.decode()

    code, out = await say("nodes trainer", OPERATOR)
    assert code == 0 and "IDLE+DRAIN" in out and "drain" in out and "by hand" in out, out
    code, out = await say("undrain n3", OPERATOR)
    assert code == ExitCode.DENIED, out
    code, out = await say("undrain n3", ADMIN)
    assert code == 0 and "undrained n3 on the cluster of trainer: now IDLE" in out, out
    assert stack.cluster.unhealthy() == {}
