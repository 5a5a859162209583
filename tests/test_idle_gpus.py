"""Idle GPUs: the rule on recorded ``nvidia-smi`` output (idle, busy and ``[N/A]`` MIG rows), and
end to end — a real job on an in-process SSH host whose ``nvidia-smi`` stand-in reports its GPUs
idle raises one ``idle_gpus`` incident naming them, resolved once they work again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from handlers.watch.cycle import Watcher
from pipeline.config import Config, GpuRoles, JobConfig
from pipeline.observe.gpus import parse_query_gpu
from pipeline.observe.idle import idle_since, watched
from pipeline.observe.watch import ActionKind, Observation, Situation
from pipeline.state import keys
from pipeline.state.incidents import IncidentKind, IncidentStore, WatchState
from pipeline.state.redisconn import RedisHandle
from pipeline.verdict import Verdict
from tests.fixtures.ssh import InProcessHost
from tests.test_watch import T0, _true, job_cfg, open_harness, run_cycles, until

NVIDIA = Path(__file__).parent / "fixtures" / "nvidia"
IDLE = (NVIDIA / "h100_query_gpu_idle_mig.txt").read_text()  #: GPUs 1 (0%) and 6 (3%) idle, 3 and 7 MIG
BUSY = (NVIDIA / "h100_query_gpu_not_supported.txt").read_text()
ROLES = GpuRoles(target=[0, 1, 2, 3, 4], drafter=[5, 6, 7])


def _cfg(**watch: Any) -> JobConfig:
    cfg = job_cfg(8, idle_gpu_below=5, idle_gpu_for=60, **watch)
    return cfg.model_copy(update={"gpus": ROLES})


def _seen(t: float, text: str, cfg: JobConfig) -> Observation:
    return Observation(
        at=T0 + t,
        count=8,
        pids=tuple(range(100, 108)),
        log_size=int(t) + 1,
        gpus=watched(cfg, parse_query_gpu(text)),
    )


def test_recorded_mig_rows_are_never_idle() -> None:
    """Of the recorded rows, the 0% and 3% GPUs are idle under 5%; the [N/A] MIG GPUs are not, whatever the threshold."""
    readings = watched(_cfg(), parse_query_gpu(IDLE))
    assert [(r.index, r.role, r.utilization_pct) for r in readings][:4] == [
        (0, "target", 97.0),
        (1, "target", 0.0),
        (2, "target", 98.0),
        (3, "target", None),
    ]
    assert idle_since(readings, 5, {}, T0) == {1: T0, 6: T0}
    assert set(idle_since(readings, 100, {}, T0)) == {0, 1, 2, 4, 5, 6}  # never 3 or 7
    assert idle_since(readings, 5, {1: T0 - 30, 2: T0 - 30}, T0) == {1: T0 - 30, 6: T0}  # 2 works again


def test_idle_for_idle_gpu_for_opens_one_incident_naming_the_gpus_and_resolves() -> None:
    """Idle GPUs raise nothing before idle_gpu_for, then one idle_gpus incident naming them; busy again resolves it."""
    cfg = _cfg()
    ds = run_cycles(
        cfg,
        [_seen(t, IDLE, cfg) for t in (0, 30, 59)]
        + [_seen(t, IDLE, cfg) for t in (60, 90)]
        + [_seen(91, BUSY, cfg)],
        Situation(running_verdict=True),
    )
    assert [d.condition for d in ds[:3]] == ["ok", "ok", "ok"]
    opened = [a for d in ds for a in d.actions if a.kind is ActionKind.OPEN]
    assert len(opened) == 1 and opened[0].incident.kind is IncidentKind.IDLE_GPUS
    inc = opened[0].incident
    assert inc.idle_gpus == "1,6"
    assert inc.cause == "GPU 1 (target) 0%, GPU 6 (drafter) 3% (2 of 8 watched) under 5% for 1 min"
    assert ds[4].actions == ()  # still idle: no second alert
    assert [a.kind for a in ds[5].actions] == [ActionKind.RESOLVE] and ds[5].state.idle_gpus_since is None


def test_no_idle_alert_when_off_warming_up_or_unread() -> None:
    """Off by default; warmup after a launch does not count; a cycle without GPU readings is no verdict."""
    off = job_cfg(8).model_copy(update={"gpus": ROLES})
    assert all(d.condition == "ok" for d in run_cycles(off, [_seen(t, IDLE, off) for t in (0, 100, 200)]))
    cfg = _cfg(warmup=120)
    warm = run_cycles(cfg, [_seen(t, IDLE, cfg) for t in (0, 100, 150, 215)], Situation(launched_at=T0))
    assert [d.condition for d in warm] == [
        "ok",
        "ok",
        "ok",
        "idle_gpus",
    ]  # counted from the first cycle after warmup
    cfg = _cfg()
    unread = [_seen(0, IDLE, cfg), _seen(70, IDLE, cfg), Observation(at=T0 + 80, count=8, log_size=99)]
    ds = run_cycles(cfg, unread)
    assert [d.condition for d in ds] == ["ok", "idle_gpus", "idle_gpus"]  # nvidia-smi failed: stays open


async def test_watch_state_keeps_idle_starts_in_redis(redis_handle: RedisHandle) -> None:
    """The per-GPU idle starts survive a round trip through the watcher's memory in Redis."""
    store = redis_handle.open_store(IncidentStore)
    await store.save_states({"job": WatchState(idle_gpus_since={1: T0, 6: T0 + 1.5})})
    state = WatchState.model_validate(await store.hash(keys.watch_state(store.prefix, "job")))
    assert state.idle_gpus_since == {1: T0, 6: T0 + 1.5}
    await store.save_states({"job": WatchState()})
    assert (
        WatchState.model_validate(await store.hash(keys.watch_state(store.prefix, "job"))).idle_gpus_since
        is None
    )


async def test_idle_gpus_end_to_end_alert_and_resolution(tmp_path: Path, redis_config: Config) -> None:
    """A running job whose GPUs nvidia-smi reports idle gets one idle_gpus alert naming GPUs 1 and 6; busy again, one resolution."""
    jobs = {
        "pipe": {"processes": 1, "idle_gpu_below": 5, "idle_gpu_for": 0.5, "warmup": 0.01, "stall_after": 60}
    }
    async with open_harness(tmp_path, redis_config, jobs) as h:
        host = h.host
        assert isinstance(host, InProcessHost)
        spec = h.config.jobs["pipe"].model_copy(update={"gpus": ROLES})
        h.config.jobs["pipe"] = spec
        (host.nvidia_dir / "query-gpu.txt").write_text(BUSY)
        watcher = Watcher(h.ctx)
        run = await h.launch("pipe")
        assert run.verdict is Verdict.RUNNING
        await watcher.cycle("local", ["pipe"])
        assert h.alerts() == []
        (host.nvidia_dir / "query-gpu.txt").write_text(IDLE)
        assert await until(lambda: _true(h.alerts()), 10, lambda: watcher.cycle("local", ["pipe"]))
        (alert,) = h.alerts()
        assert alert.reply.title.startswith("pipe has idle GPUs on local")
        assert any(
            "GPU 1 (target) 0%, GPU 6 (drafter) 3% (2 of 8 watched) under 5%" in ln
            for ln in alert.reply.lines
        )
        (host.nvidia_dir / "query-gpu.txt").write_text(BUSY)
        assert await until(
            lambda: _true(h.thread("resolved after")), 10, lambda: watcher.cycle("local", ["pipe"])
        )
        (resolved,) = h.thread("resolved after")
        assert resolved.reply.title.endswith("the GPUs of pipe are working again")
        assert len(h.alerts()) == 1


async def test_without_gpu_roles_the_gpus_its_processes_hold_are_watched(
    tmp_path: Path, redis_config: Config
) -> None:
    """A job naming no gpus is watched on the GPUs nvidia-smi lists its PIDs on (by GPU UUID): only those are named."""
    jobs = {
        "solo": {"processes": 1, "idle_gpu_below": 5, "idle_gpu_for": 0.3, "warmup": 0.01, "stall_after": 60}
    }
    async with open_harness(tmp_path, redis_config, jobs) as h:
        host = h.host
        assert isinstance(host, InProcessHost)
        (host.nvidia_dir / "query-gpu.txt").write_text(IDLE)
        watcher = Watcher(h.ctx)
        run = await h.launch("solo")
        assert run.pid is not None
        uuids = dict(
            line.split(", ") for line in (NVIDIA / "h100_query_gpu_uuid.txt").read_text().splitlines()
        )
        # the job holds GPU 6 (idle) and GPU 7 (MIG, [N/A]); another process holds GPU 1 (idle, not the job's)
        (host.nvidia_dir / "query-compute-apps-uuid.txt").write_text(
            f"{h.pids('solo')[0]}, {uuids['6']}\n{h.pids('solo')[0]}, {uuids['7']}\n999999, {uuids['1']}\n"
        )
        assert await until(lambda: _true(h.alerts()), 10, lambda: watcher.cycle("local", ["solo"]))
        (alert,) = h.alerts()
        assert any("detected cause: GPU 6 3% (1 of 2 watched) under 5% for" in ln for ln in alert.reply.lines)
        assert not any("GPU 1" in ln for ln in alert.reply.lines)
