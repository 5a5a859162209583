"""Every error a person can see, built from ids in one module.

Two kinds of failure reach a person (the errbot/Bolt pattern): a :class:`PitstopError`
carries a message written for the user and is shown as it is; anything else is logged
with its traceback and the user gets one line with an incident id
(:func:`pipeline.messages.internal_error`).

Each error carries the CLI exit code it maps to (:class:`ExitCode`), so every surface
agrees on what a failure means.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import IntEnum

from pipeline import messages


class ExitCode(IntEnum):
    """Exit codes shared by every ``pitstop`` command (listed in the README)."""

    OK = 0
    FAILED = 1  #: the action failed, or the verdict is not RUNNING (nor PENDING)
    USAGE = 2  #: usage, parse or config error
    DENIED = 3  #: the requester lacks the role
    IN_FLIGHT = 4  #: refused: another restart of the job is in flight
    CANCELLED = 5  #: cancelled, or timed out waiting
    PENDING = 6  #: the verdict is PENDING: the job is queued by its scheduler; the real verdict follows


class PitstopError(Exception):
    """An expected failure whose message is written for the person who asked.

    :param message: one line (or a few) a person can act on; shown as it is.
    """

    exit_code: ExitCode = ExitCode.FAILED

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ConfigError(PitstopError):
    """The configuration file is missing or invalid.

    :param problems: one line per problem, each naming its TOML path or line.
    """

    exit_code = ExitCode.USAGE

    def __init__(self, problems: Sequence[str], source: str = "") -> None:
        self.problems = list(problems)
        self.source = source
        super().__init__(messages.config_invalid(source, self.problems))


class UsageError(PitstopError):
    """A CLI invocation that cannot be carried out as given."""

    exit_code = ExitCode.USAGE


# --- remote execution -------------------------------------------------------------------------


class RemoteError(PitstopError):
    """Base of every failure talking to a host.

    :param host: the configured host name.
    """

    def __init__(self, host: str, message: str) -> None:
        self.host = host
        super().__init__(message)


class HostUnreachable(RemoteError):
    """The host could not be reached (refused, timed out, DNS, lost connection)."""

    def __init__(self, host: str, reason: str) -> None:
        self.reason = reason
        super().__init__(host, messages.host_unreachable(host, reason))


class HostKeyRejected(RemoteError):
    """The host's key is unknown or differs from the one pinned in ``known_hosts``."""

    def __init__(self, host: str, fingerprint: str, known_hosts: str) -> None:
        self.fingerprint = fingerprint
        self.known_hosts = known_hosts
        super().__init__(host, messages.host_key_rejected(host, fingerprint, known_hosts))


class RemoteCommandError(RemoteError):
    """A remote command failed in a way its caller did not expect.

    Keeps what asyncssh's ``ProcessError`` keeps: the command, the exit status or
    signal, and the (partial) output.
    """

    def __init__(
        self,
        host: str,
        argv: Sequence[str],
        message: str,
        *,
        exit_status: int | None = None,
        exit_signal: str | None = None,
        stdout: str = "",
        stderr: str = "",
    ) -> None:
        self.argv = tuple(argv)
        self.exit_status = exit_status
        self.exit_signal = exit_signal
        self.stdout = stdout
        self.stderr = stderr
        super().__init__(host, message)


class RemoteTimeout(RemoteCommandError):
    """A remote command did not finish within its timeout; keeps the partial output."""

    exit_code = ExitCode.CANCELLED

    def __init__(
        self, host: str, argv: Sequence[str], timeout: float, *, stdout: str = "", stderr: str = ""
    ) -> None:
        super().__init__(
            host, argv, messages.remote_timeout(host, argv, timeout), stdout=stdout, stderr=stderr
        )
        self.timeout = timeout


# --- the restart sequence ---------------------------------------------------------------------


class PreflightFailed(PitstopError):
    """A pre-flight check failed; nothing was stopped.

    :param check: the check's name (``host``, ``workdir``, ``launch``, ``patch``, ``log_dir``, ``disk``).
    """

    def __init__(self, job: str, check: str, detail: str) -> None:
        self.job = job
        self.check = check
        self.detail = detail
        super().__init__(messages.preflight_failed(job, check, detail))


class StopFailed(PitstopError):
    """The old run could not be stopped; the listed PIDs survive."""

    def __init__(self, job: str, survivors: Sequence[int], detail: str = "") -> None:
        self.job = job
        self.survivors = list(survivors)
        super().__init__(messages.stop_failed(job, self.survivors, detail))


class LaunchFailed(PitstopError):
    """The launch command did not start a process."""

    def __init__(self, job: str, detail: str) -> None:
        self.job = job
        self.detail = detail
        super().__init__(messages.launch_failed(job, detail))


class RunCancelled(PitstopError):
    """A run was cancelled at a step boundary."""

    exit_code = ExitCode.CANCELLED

    def __init__(self, job: str, run_id: str, after_step: str | None) -> None:
        self.job = job
        self.run_id = run_id
        self.after_step = after_step
        super().__init__(messages.run_cancelled(job, run_id, after_step))


class UnknownRun(PitstopError):
    """No run record with that id."""

    exit_code = ExitCode.USAGE

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        super().__init__(messages.unknown_run(run_id))


# --- Slack surface (bot/serve.py) ---------------------------------------------------------------


class SlackUnavailable(PitstopError):
    """Slack refused the tokens or could not be reached at start-up (``pitstop serve``)."""

    exit_code = ExitCode.USAGE

    def __init__(self, method: str, error: str) -> None:
        self.method = method
        self.error = error
        super().__init__(messages.slack_unavailable(method, error))


# --- remote execution and probes (pipeline/remote.py, hostprobe.py, gpus.py) -------------------


class UnknownHost(PitstopError):
    """A host name that is not configured."""

    exit_code = ExitCode.USAGE

    def __init__(self, name: str, known: Sequence[str]) -> None:
        self.name = name
        self.known = list(known)
        super().__init__(messages.unknown_host(name, self.known))


class HostAuthRejected(HostUnreachable):
    """The host answered but refused the login (keys, user); a kind of unreachable."""

    def __init__(self, host: str, user: str, reason: str) -> None:
        self.user = user
        RemoteError.__init__(self, host, messages.host_auth_rejected(host, user, reason))
        self.reason = reason


class GpuQueryFailed(RemoteError):
    """``nvidia-smi`` could not be run or its output read."""

    def __init__(self, host: str, detail: str) -> None:
        self.detail = detail
        super().__init__(host, messages.gpu_query_failed(host, detail))
