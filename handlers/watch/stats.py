"""What the watcher measured of its own work, for ``/metrics`` (``bot/runtime/metrics.py``): per host its
probes and watch cycles, per job the processes its last probe saw.  Kept in memory by
:class:`handlers.watch.cycle.Watcher`: a replica that does not lead the scheduler reports nothing."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class HostStats:
    """One host's watching, since this process started."""

    probe_s: float | None = None  #: seconds the last probe took (every job of the host in one call)
    probes: int = 0
    failures: int = 0  #: probes that could not reach the host (confirmed over a fresh connection)
    #: seconds the last watch cycle took, probe, decisions and Redis writes included (not its posts)
    cycle_s: float | None = None
    cycles: int = 0


@dataclass
class WatchStats:
    """The watcher's measurements (see the module doc)."""

    hosts: dict[str, HostStats] = field(default_factory=dict)
    seen: dict[str, int] = field(default_factory=dict)  #: job → processes its last probe saw

    def probed(self, host: str, seconds: float, *, failed: bool) -> None:
        """Record one probe of ``host`` that took ``seconds``."""
        stats = self.hosts.setdefault(host, HostStats())
        stats.probe_s = seconds
        stats.probes += 1
        stats.failures += int(failed)

    def cycled(self, host: str, seconds: float) -> None:
        """Record one watch cycle of ``host`` that took ``seconds``."""
        stats = self.hosts.setdefault(host, HostStats())
        stats.cycle_s = seconds
        stats.cycles += 1
