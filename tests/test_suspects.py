"""Suspect nodes: evidence (an Xid in a log or dmesg, uncorrected ECC errors, NODE_FAIL, a stuck
rank's or a degraded count's node) makes a node suspect for ``[watch] suspect_for``, kept beside
Pitstop's drains; it expires on its own; a person's restart is told; the alert and ``nodes`` say why.

The nvidia-smi and dmesg texts replayed here (``tests/fixtures/nvidia/ecc_*.txt``,
``tests/fixtures/kernel/dmesg_xid79.txt``) are written in the tools' own formats
(``--format=csv,noheader,nounits``; the NVRM lines of an Xid 79)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from handlers.outbox import MemoryOutbox
from handlers.request.dispatch import Dispatcher, Request
from handlers.watch.alerts import alert_reply
from handlers.watch.cycle import Watcher
from handlers.watch.suspects import excluding
from pipeline.config import AuthSettings, Config, HostConfig, JobConfig, parse_config
from pipeline.config.jobs import AutoRestart, CrashClass, WatchSettings
from pipeline.engines.slurm import cluster_of
from pipeline.fmt import clock
from pipeline.host.helper import OOM_RX
from pipeline.observe.crashes import classify
from pipeline.observe.suspects import ecc_words, failed_nodes, node_of_rank, parse_ecc, short_node, xid
from pipeline.state.incidents import Incident, IncidentKind, IncidentStore
from pipeline.state.nodes import NodeNote, NodeNotes, Suspicion
from pipeline.state.redisconn import RedisHandle
from tests.test_slurm import MakeSlurm, context, make_slurm, redis_handle, shared_redis_url  # noqa: F401

FIXTURES = Path(__file__).parent / "fixtures"
DMESG_XID = (FIXTURES / "kernel" / "dmesg_xid79.txt").read_text()
ADMIN = "U0ADMIN1"
T0 = 1_780_000_000.0  #: 2026-05-28 20:26:40 UTC (an injected clock: no test reads the wall clock)


def test_an_xid_is_found_with_its_number_in_dmesg_and_in_a_log() -> None:
    """The helper keeps dmesg's Xid lines; `xid` names the Xid and its number; none in a clean log."""
    kept = [ln.strip() for ln in DMESG_XID.splitlines() if OOM_RX.search(ln)]
    assert len(kept) == 1 and "NVRM: Xid (PCI:0000:3b:00): 79" in kept[0], kept
    assert xid(kept) == "Xid 79"
    assert xid(["[rank3] NVRM: Xid 48: DBE"]) == "Xid 48"
    assert xid(["step 10 loss 2.3", "rank 0 done"]) is None


def test_an_xid_only_in_the_hosts_dmesg_classifies_the_crash_as_xid() -> None:
    """A log that ends in a SIGKILL, with the host's dmesg holding an Xid: the crash is `xid`, its
    evidence the kernel's line (the hardware explains the rest)."""
    kernel = [ln.strip() for ln in DMESG_XID.splitlines() if OOM_RX.search(ln)]
    log = b'{"step":40,"role":"drafter","rank":6,"tokens_per_s":1.0}\ndflash-main: drafter rank 6 (pid 48213) exited with code -9; stopping\n'
    crash = classify(log, kernel=kernel)
    assert (crash.kind, crash.rank, crash.step) == (CrashClass.XID, 6, 40)
    assert crash.evidence is not None and crash.evidence.endswith(
        "79, pid=48213, name=python3, GPU has fallen off the bus."
    )
    assert classify(log, kernel=[]).kind is CrashClass.KILLED


def test_uncorrected_ecc_errors_are_read_as_the_gpu_tables_are() -> None:
    """nvidia-smi's ECC column: GPUs with errors only; [N/A] (no ECC) is no reading, never 0 errors."""
    errors = parse_ecc((FIXTURES / "nvidia" / "ecc_uncorrected_gpu3.txt").read_text())
    assert errors == {3: 2}
    assert ecc_words(errors) == "uncorrected ECC errors on GPU 3 (2)"
    assert ecc_words({1: 1, 3: 2}) == "uncorrected ECC errors on GPUs 1 (1), 3 (2)"
    assert parse_ecc((FIXTURES / "nvidia" / "ecc_not_supported.txt").read_text()) == {}


def test_the_node_evidence_points_at() -> None:
    """A failed node is one Slurm shows down or not responding; a rank's node by block layout; a
    degraded detail naming one node points at it, naming several points at none."""
    states = {"n1": "MIXED", "n2": "DOWN*", "n3": "IDLE+NOT_RESPONDING", "n4": "ALLOCATED"}
    assert failed_nodes(("n1", "n2", "n4"), states) == ["n2"]
    assert failed_nodes(("n3",), states) == ["n3"]
    assert [node_of_rank(r, ("n1", "n2"), 4) for r in (0, 3, 4, 7, 8)] == ["n1", "n1", "n2", "n2", None]
    assert short_node("n2 has 3/4 processes (Slurm job 12)") == "n2"
    assert short_node("n1 has 0/4 processes; n2 has 3/4 processes (Slurm job 12)") is None
    assert short_node(None) is None


def test_suspect_for_is_a_service_wide_watch_key_with_a_day_by_default() -> None:
    """`[watch] suspect_for` takes a duration; absent, a node stays suspect 24 h."""
    base = {"hosts": {"gpu1": {"address": "10.0.0.1"}}}
    assert parse_config(base, "t", Path.cwd()).watch.suspect_for == 86400
    assert parse_config({**base, "watch": {"suspect_for": "6h"}}, "t", Path.cwd()).watch.suspect_for == 21600


async def test_a_suspicion_is_kept_beside_drains_and_expires_by_itself(redis_handle: RedisHandle) -> None:  # noqa: F811
    """A suspect node is kept with its evidence, beside a drain of the same node; past its `until`
    (an injected clock) it is gone, and forgotten; the drain stays."""
    notes = redis_handle.open_store(NodeNotes)
    await notes.put("login", "n2", NodeNote(by="U1", reason="bad ECC", at=T0))
    held = Suspicion(why="Xid 79", job="trainer", at=T0, until=T0 + 86400)
    await notes.suspect("login", "n2", held)
    assert await notes.suspects("login", T0 + 60) == {"n2": held}
    assert await notes.suspects("other", T0 + 60) == {}
    assert await notes.suspects("login", T0 + 86400) == {}
    assert await notes.suspects("login", T0) == {}  # forgotten, not merely hidden
    assert list(await notes.of("login")) == ["n2"]


def test_a_persons_restart_is_told_of_suspect_nodes_it_does_not_leave_out() -> None:
    """`n2 is suspect (Xid 79 at …): restart dflash excluding n2`; the nodes it already excludes are
    kept in the offer; nothing when every suspect node is excluded."""
    suspects = {"n2": Suspicion(why="Xid 79", job="dflash", at=T0, until=T0 + 86400)}
    assert (
        excluding("dflash", suspects, ())
        == "n2 is suspect (Xid 79 at 20:26:40 UTC): restart dflash excluding n2"
    )
    assert excluding("dflash", suspects, ("n3",)) == (
        "n2 is suspect (Xid 79 at 20:26:40 UTC): restart dflash excluding n3,n2"
    )
    assert excluding("dflash", suspects, ("n2",)) is None
    assert excluding("dflash", {}, ()) is None


@pytest.mark.parametrize("story", [None, "story:1"])
def test_the_alert_says_which_nodes_are_suspect_and_why(story: str | None) -> None:
    """The incident's alert carries its suspect line (also when told in a grouped post)."""
    config = Config(
        hosts={"login": HostConfig(address="10.0.0.1")},
        jobs={
            "trainer": JobConfig(
                host="login", match="x", launch=["./run.sh"], workdir="/w", log="/w/train.log"
            )
        },
    )
    line = "suspect until 2026-05-29 20:26:40 UTC (automatic restarts leave them out): n2 (Xid 79)"
    inc = Incident(
        job="trainer",
        host="login",
        kind=IncidentKind.DEAD,
        opened_at=T0,
        notified_at=T0,
        suspects=line,
        story=story,
    )
    assert line in alert_reply(inc, config, now=T0).lines


# --- on the cluster -----------------------------------------------------------------------------


async def test_a_degraded_node_is_suspect_shown_by_nodes_and_left_out_by_the_automatic_restart(
    make_slurm: MakeSlurm,  # noqa: F811
) -> None:
    """A task killed on n2: the degraded alert names n2 as suspect and why, `nodes` shows it, a
    person's restart is told; when the job then dies, the automatic restart excludes n2 and the
    verdict names the nodes it runs on now."""
    policy = AutoRestart(max=3, within=600, backoff=0.001, on=list(CrashClass))
    stack = await make_slurm(watch=WatchSettings(degraded_after=0.001, stall_after=600, auto_restart=policy))
    run = await stack.start()
    assert run.verdict_line == f"RUNNING 8/8 processes job {run.slurm_job} on 2 nodes"
    stack.config = stack.config.model_copy(update={"auth": AuthSettings(admins=[ADMIN], viewers=["*"])})
    stack.restarter.config = stack.config
    outbox = MemoryOutbox()
    ctx = context(stack, outbox)
    watcher = Watcher(ctx)
    assert (await watcher.cycle("login"))["trainer"].condition == "ok"
    tasks = await stack.engine.client.node_tasks(stack.name, run.slurm_job or 0, stack.token)
    os.kill(next(t for t in tasks if t.node == "n2").pids[0], signal.SIGKILL)
    for _ in range(2):
        decisions = await watcher.cycle("login")
    assert decisions["trainer"].condition == "degraded", decisions
    [alert] = outbox.of("announce")
    why = f"degraded: n2 has 3/4 processes (Slurm job {run.slurm_job})"
    told = [ln for ln in alert.reply.lines if ln.startswith("suspect until ")]
    assert told and told[0].endswith(f"(automatic restarts leave them out): n2 ({why})"), alert.reply.lines
    inc = await ctx.redis.open_store(IncidentStore).incident("trainer")
    assert inc is not None
    held = await ctx.redis.open_store(NodeNotes).suspects(cluster_of(ctx.config, "trainer"), inc.opened_at)
    assert list(held) == ["n2"] and held["n2"].why == why and held["n2"].until == inc.opened_at + 86400

    dispatcher = Dispatcher(ctx)
    listed = await dispatcher.handle(Request("nodes trainer", "U0VIEWER"))
    cell = next((r for t in listed.tables for r in t.rows if r[0] == "n2"), (listed.title,))[-1]
    assert cell.startswith("suspect until ") and cell.endswith(
        f": {why} (seen {clock(inc.opened_at, date=False)})"
    )

    stack.cluster.run("scancel", str(run.slurm_job))
    deadline = time.monotonic() + 60
    while not [r for r in await ctx.runs.recent("trainer") if r.id != run.id]:
        assert time.monotonic() < deadline, outbox.of("thread")
        await watcher.cycle("login")
    await watcher.drain(120)
    [auto] = [r for r in await ctx.runs.recent("trainer") if r.id != run.id]
    assert auto.exclude == ["n2"], auto
    verified = await stack.restarter.verify(await ctx.runs.get(auto.id))
    assert verified.verdict_line == f"RUNNING 8/8 processes job {verified.slurm_job} on 2 nodes (n1, n3)", (
        verified.evidence
    )

    asked = await dispatcher.handle(Request("restart trainer", ADMIN))
    at = clock(inc.opened_at, date=False)
    assert f"n2 is suspect ({why} at {at}): restart trainer excluding n2" in asked.lines, asked.lines
    await dispatcher.drain(120)
