"""No verdict from one failed probe: a host is unreachable only after N failed cycles over >= 2
intervals, and an unreachable host never triggers an automatic restart."""

from __future__ import annotations

from pipeline.config import AutoRestart
from pipeline.observe.watch import ActionKind, Observation
from pipeline.state.incidents import IncidentKind
from tests.test_watch import T0, alive, job_cfg, kinds, run_cycles


def gone(t: float) -> Observation:
    """A cycle whose probe and fresh connection both failed."""
    return Observation(at=T0 + t, reachable=False, error="connection refused")


def test_a_host_that_drops_one_probe_raises_nothing() -> None:
    """alive, one failed probe, alive again: no incident, no restart, the failure count resets."""
    cfg = job_cfg(interval=1, auto_restart=AutoRestart(backoff=1))
    decisions = run_cycles(cfg, [alive(0), alive(1), gone(2), alive(3), gone(4), gone(5), alive(6)])
    assert kinds(decisions) == []
    assert [d.condition for d in decisions][2:4] == ["probe_failed", "ok"]
    assert decisions[-1].state.probe_failures is None


def test_a_host_gone_for_3_intervals_is_one_unreachable_incident_and_no_restart() -> None:
    """Gone at 1 s intervals: unreachable at the 3rd failure (2 intervals after the first), once; the job
    is never restarted automatically, and the incident resolves when the host answers."""
    cfg = job_cfg(interval=1, auto_restart=AutoRestart(backoff=1))
    obs = [alive(0), *(gone(t) for t in range(1, 12)), alive(12)]
    decisions = run_cycles(cfg, obs)
    assert [d.condition for d in decisions[1:4]] == ["probe_failed", "probe_failed", "unreachable"]
    assert kinds(decisions) == [
        (ActionKind.OPEN, IncidentKind.UNREACHABLE),
        (ActionKind.RESOLVE, IncidentKind.UNREACHABLE),
    ]
    assert not any(a.kind is ActionKind.AUTO_RESTART for d in decisions for a in d.actions)


def test_failures_must_span_two_intervals_and_n_is_configurable() -> None:
    """Three quick failures within one interval are not enough; unreachable_after = 5 waits for 5."""
    quick = run_cycles(job_cfg(interval=10), [alive(0), gone(1), gone(2), gone(3)])
    assert kinds(quick) == []
    five = run_cycles(job_cfg(interval=1, unreachable_after=5), [alive(0), *(gone(t) for t in range(1, 6))])
    assert [d.condition for d in five[1:]] == ["probe_failed"] * 4 + ["unreachable"]
