"""What every benchmark under ``bench/`` shares: its pass/fail conditions and its quick mode.

A benchmark measures side by side, prints its table, then its conditions, then ONE summary line
(the last line it prints, which ``make bench`` collects).  A condition is either about
correctness (the job really ran, every request was answered — checked in every mode) or about
speed (a bound that only a real regression crosses, set well beyond the stated target so load
on a shared machine does not trip it — checked only in a full run).  ``--quick`` (what
``make bench-smoke`` and the test suite run) uses small sizes and checks no speed at all.

Usage::

    checks = Checks(quick=args.quick)
    checks.correct("every job seen healthy", healthy == jobs, f"{healthy}/{jobs}")
    checks.bound("CPU share at 10 s under 10 %", share < 10.0, f"{share:.1f} %")
    checks.target("pitstop within 1.5x of bare", ratio <= 1.5, f"{ratio:.2f}x")
    print(checks.summary("watch: …"))  # the summary line, naming any failed condition
    return checks.status
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Checks:
    """A benchmark's conditions, printed as they are added.

    :ivar quick: quick mode: speed bounds and targets are shown as skipped, never fail.
    :ivar failed: the failed conditions' descriptions.
    """

    quick: bool = False
    failed: list[str] = field(default_factory=list)

    def correct(self, what: str, ok: bool, detail: str = "") -> bool:
        """A correctness condition, checked in every mode; a failure makes the run fail."""
        return self._report("check", what, ok, detail, fails=True)

    def bound(self, what: str, ok: bool, detail: str = "") -> bool:
        """A regression bound on a speed (full runs only); a failure makes the run fail."""
        if self.quick:
            print(f"  bound  {what}: not checked in quick mode ({detail})")
            return True
        return self._report("bound", what, ok, detail, fails=True)

    def target(self, what: str, ok: bool, detail: str = "") -> bool:
        """A stated target (full runs only): reported as met or missed, never fails the run."""
        if self.quick:
            print(f"  target {what}: not checked in quick mode ({detail})")
            return True
        word = "met" if ok else "MISSED"
        print(f"  target {what}: {word} ({detail})")
        return ok

    def _report(self, kind: str, what: str, ok: bool, detail: str, *, fails: bool) -> bool:
        suffix = f" ({detail})" if detail else ""
        if ok:
            print(f"  {kind:6s} {what}: ok{suffix}")
        else:
            print(f"  {kind:6s} {what}: FAILED{suffix}", flush=True)
            if fails:
                self.failed.append(f"{what}{suffix}")
        return ok

    def summary(self, line: str) -> str:
        """The summary line, with the failed conditions named at its end when there are any."""
        return f"{line} | FAILED: {'; '.join(self.failed)}" if self.failed else line

    @property
    def status(self) -> int:
        """The exit status: 0 when no correctness condition or regression bound failed, else 1."""
        return 1 if self.failed else 0
