"""All text a person reads, as small functions that return strings.

One place for wording (as Bolt's ``logger/messages.py``), so tests compare against these
functions and every surface (Slack, console, CLI) says the same thing.  Sections are
grouped by the concept that speaks; keep each function small and free of I/O.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

# --- config and CLI ---------------------------------------------------------------------------


def config_invalid(source: str, problems: Sequence[str]) -> str:
    """Header plus one line per problem of an invalid config file."""
    if len(problems) == 1 and (not source or problems[0].startswith(source)):
        return problems[0]
    head = f"{source}: invalid configuration" if source else "invalid configuration"
    return "\n".join([head, *problems])


def config_missing(path: str) -> str:
    """The config file does not exist."""
    return (
        f"{path}: config file not found - pass --config FILE, set PITSTOP_CONFIG, "
        "or copy pitstop.example.toml to ./pitstop.toml"
    )


def config_summary(source: str, hosts: int, jobs: int, redis: str) -> str:
    """The one-line summary ``pitstop check-config`` prints for a valid file."""
    return f"{source}: ok - {hosts} host(s), {jobs} job(s), redis: {redis}"


def embedded_redis_started(path: str) -> str:
    """Start-up notice when no ``[redis] url`` is configured."""
    return f"no [redis] url configured - using embedded Redis at {path}"


def internal_error(incident: str) -> str:
    """What a person sees for an unexpected failure; the traceback is in the log."""
    return f"something went wrong inside Pitstop (incident {incident}); the details are in its log"


def demo_not_built() -> str:
    """Placeholder shown by ``make demo`` before the demo exists."""
    return "the demo is not built yet - checked the example config instead"


# --- remote execution -------------------------------------------------------------------------


def host_unreachable(host: str, reason: str) -> str:
    """A host could not be reached."""
    return f"host {host} unreachable: {reason}"


def host_key_rejected(host: str, fingerprint: str, known_hosts: str) -> str:
    """A host key was unknown or changed."""
    return (
        f"host {host} presented key {fingerprint}, which does not match {known_hosts} - "
        "refusing to connect; if the host was rebuilt, verify the key and update known_hosts"
    )


def remote_timeout(host: str, argv: Sequence[str], timeout: float) -> str:
    """A remote command outlived its timeout."""
    return f"on {host}: `{shlex.join(argv)}` did not finish within {timeout:g} s"


# --- the restart sequence ---------------------------------------------------------------------


def preflight_failed(job: str, check: str, detail: str) -> str:
    """A pre-flight check failed; the running job was left untouched."""
    return f"pre-flight check '{check}' failed for {job}: {detail} - nothing was stopped"


def stop_failed(job: str, survivors: Sequence[int], detail: str) -> str:
    """Processes of the old run survived the stop."""
    pids = ", ".join(str(p) for p in survivors) or "none listed"
    tail = f" ({detail})" if detail else ""
    return f"could not stop {job}: still alive: pid {pids}{tail} - not relaunching"


def launch_failed(job: str, detail: str) -> str:
    """The launch did not start a process."""
    return f"launch of {job} failed: {detail}"


def run_cancelled(job: str, run_id: str, after_step: str | None) -> str:
    """A run was cancelled at a step boundary."""
    if after_step is None:
        return f"run {run_id} for {job} cancelled before anything was changed"
    return f"run {run_id} for {job} cancelled after step {after_step} - the job may be stopped"


def unknown_run(run_id: str) -> str:
    """No run record with that id."""
    return f"no run {run_id}"


def missing_env(name: str) -> str:
    """A required environment variable is unset."""
    return f"{name} is not set - export it (secrets are read from the environment only)"
