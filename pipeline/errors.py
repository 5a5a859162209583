"""Every error a person can see: its code, the fields it was built from, and its text.

A :class:`PitstopError` carries a message written for the user and is shown as it is; anything
else is logged with its traceback under an incident id (:func:`new_incident_id`) and the user
gets one line naming it (:func:`internal_error`).  Each class has a stable string ``code`` (it
never changes once released), keeps its fields as attributes, builds its own text from them,
and maps to a CLI exit code (:class:`ExitCode`).  :func:`error_class` turns a code back into its
class.  Other packages' errors: ``handlers.grammar.commands.ParseError``, ``handlers.request.auth.Denied``
(and ``NotYourself``), ``bot.console.identity.IdentityRefused``, ``pipeline.state.locks.InFlight``,
``bot.demo.run.DemoFailed``.
"""

from __future__ import annotations

import shlex
import uuid
from collections.abc import Sequence
from enum import IntEnum
from typing import Any, ClassVar, TypedDict


class ExitCode(IntEnum):
    """Exit codes shared by every ``pitstop`` command (listed in the README)."""

    OK = 0
    FAILED = 1  #: the action failed, or the verdict is not RUNNING (nor PENDING)
    USAGE = 2  #: usage, parse or config error
    DENIED = 3  #: the requester lacks the role
    IN_FLIGHT = 4  #: refused: another restart of the job is in flight
    CANCELLED = 5  #: cancelled, or timed out waiting
    PENDING = 6  #: the verdict is PENDING: the job is queued by its scheduler; the real verdict follows
    AWAITING_APPROVAL = 7  #: the action waits for a second person's approval (``approve r-N``)


def new_incident_id() -> str:
    """A fresh incident id for an unexpected failure (8 hex digits), logged and shown."""
    return uuid.uuid4().hex[:8]


def internal_error(incident: str) -> str:
    """What a person sees for an unexpected failure; ``incident`` is from :func:`new_incident_id`."""
    return f"something went wrong inside Pitstop (incident {incident}); the details are in its log"


class PitstopError(Exception):
    """An expected failure whose ``message`` (a line or a few a person can act on) is shown as it is."""

    code: ClassVar[str] = "error"
    exit_code: ExitCode = ExitCode.FAILED

    def __init_subclass__(cls, code: str = "", exit_code: ExitCode | None = None, **kw: Any) -> None:
        """A subclass names its ``code`` (else keeps its parent's) and ``exit_code`` in its bases."""
        super().__init_subclass__(**kw)
        cls.code, cls.exit_code = code or cls.code, exit_code or cls.exit_code

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def error_class(code: str) -> type[PitstopError]:
    """The error class with this ``code`` (among the classes defined so far).  :raises KeyError: if none."""
    classes: list[type[PitstopError]] = [PitstopError]
    for cls in classes:  # parents before their subclasses: a class that keeps its parent's code is not it
        classes.extend(cls.__subclasses__())
    return {c.code: c for c in reversed(classes)}[code]


class ConfigError(PitstopError, code="config_invalid", exit_code=ExitCode.USAGE):
    """The configuration file is missing or invalid: ``problems``, one line each naming its TOML
    path or line, in ``source`` (the file; "" if unknown)."""

    def __init__(self, problems: Sequence[str], source: str = "") -> None:
        self.problems = list(problems)
        self.source = source
        alone = len(self.problems) == 1 and (not source or self.problems[0].startswith(source))
        head = [] if alone else [f"{source}: invalid configuration" if source else "invalid configuration"]
        super().__init__("\n".join([*head, *self.problems]))


class UsageError(PitstopError, code="usage", exit_code=ExitCode.USAGE):
    """A CLI invocation that cannot be carried out as given: what is wrong, how to call it instead."""


class RemoteError(PitstopError, code="remote_error"):
    """Base of every failure talking to a host (``host``: its configured name)."""

    def __init__(self, host: str, message: str) -> None:
        self.host = host
        super().__init__(message)


class HostUnreachable(RemoteError, code="host_unreachable"):
    """The host could not be reached (refused, timed out, DNS, lost connection); ``reason`` in a few
    words (``message``: a subclass's text in place of the usual one)."""

    def __init__(self, host: str, reason: str, message: str = "") -> None:
        self.reason = reason
        super().__init__(host, message or f"host {host} unreachable: {reason}")


class HostKeyRejected(RemoteError, code="host_key_rejected"):
    """The host's key (``fingerprint``) is unknown (``unknown``: ``known_hosts`` holds no key for the
    host, or is missing) or differs from the one pinned in ``known_hosts``."""

    def __init__(self, host: str, fingerprint: str, known_hosts: str, *, unknown: bool = False) -> None:
        self.fingerprint = fingerprint
        self.known_hosts = known_hosts
        self.unknown = unknown
        if unknown:
            text = (
                f"host {host}'s key {fingerprint} is unknown: {known_hosts} has no key for it - "
                f"refusing to connect; check the fingerprint and trust it with `pitstop trust-host {host}`"
            )
        else:
            text = (
                f"host {host} presented key {fingerprint}, which does not match {known_hosts} - "
                "refusing to connect; if the host was rebuilt, verify the key and update known_hosts"
            )
        super().__init__(host, text)


class RemoteCommandError(RemoteError, code="remote_command"):
    """A remote command failed in a way its caller did not expect; keeps what asyncssh's
    ``ProcessError`` keeps: the command, the exit status or signal, and the (partial) output.
    Its text is one of this module's (:func:`connection_lost`, :func:`shell_killed` …) or its
    caller's."""

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


class CommandOutput(TypedDict, total=False):
    """What a failed remote command left behind, as :class:`RemoteCommandError` keeps it."""

    exit_status: int | None
    exit_signal: str | None
    stdout: str
    stderr: str


def _short(argv: Sequence[str], limit: int = 120) -> str:
    text = shlex.join(argv)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def connection_lost(host: str, argv: Sequence[str], reason: str) -> str:
    """:class:`RemoteCommandError`'s text: the SSH connection dropped while ``argv`` ran."""
    return f"on {host}: connection lost while running `{_short(argv)}`: {reason} - its outcome is unknown"


def channel_closed(host: str, argv: Sequence[str]) -> str:
    """:class:`RemoteCommandError`'s text: the channel closed without an exit status or signal."""
    return f"on {host}: `{_short(argv)}` ended without an exit status (channel closed by the host)"


def shell_killed(host: str, argv: Sequence[str], signal: str) -> str:
    """:class:`RemoteCommandError`'s text: the shell running ``argv`` was killed by ``signal``."""
    return f"on {host}: the control shell running `{_short(argv)}` was killed by {signal}"


def helper_failed(host: str, op: str, detail: str) -> str:
    """:class:`RemoteCommandError`'s text: Pitstop's host helper failed at ``op`` or gave no answer."""
    return f"on {host}: Pitstop's host helper ({op}) failed: {detail}"


def python_missing(host: str, python: str) -> str:
    """:class:`RemoteCommandError`'s text: no ``python`` for the host helper (exit status 127)."""
    return f"on {host}: `{python}` not found - Pitstop's host helper needs Python 3.8+ on the job's side"


class RemoteTimeout(RemoteCommandError, code="remote_timeout", exit_code=ExitCode.CANCELLED):
    """A remote command did not finish within ``timeout`` seconds; keeps the partial output."""

    def __init__(
        self, host: str, argv: Sequence[str], timeout: float, *, stdout: str = "", stderr: str = ""
    ) -> None:
        text = f"on {host}: `{shlex.join(argv)}` did not finish within {timeout:g} s"
        super().__init__(host, argv, text, stdout=stdout, stderr=stderr)
        self.timeout = timeout


class SequenceAborted(PitstopError, code="sequence_aborted"):
    """A restart sequence ends here (the failing step recorded its detail): the sequence finishes
    the run of ``job`` with ``verdict`` (a :class:`pipeline.verdict.Verdict` value), ``line`` (the
    verdict line, :mod:`pipeline.verdict`) and ``evidence`` (the line, unless a subclass says more)."""

    verdict: ClassVar[str] = ""

    def __init__(self, job: str, message: str, *, line: str) -> None:
        super().__init__(message)
        self.job = job
        self.line = line
        self.evidence = line


class PreflightFailed(SequenceAborted, code="preflight_failed"):
    """A pre-flight check failed; nothing was stopped (verdict ``PREFLIGHT_FAILED``).  ``check``:
    ``host``, ``host_key``, ``workdir``, ``launch``, ``patch``, ``log_dir``, ``disk``, ``running``;
    on Slurm also ``partition``, ``script``, ``sbatch``."""

    verdict = "PREFLIGHT_FAILED"

    def __init__(self, job: str, check: str, detail: str, *, line: str) -> None:
        self.check = check
        self.detail = detail
        super().__init__(
            job, f"pre-flight check '{check}' failed for {job}: {detail} - nothing was stopped", line=line
        )


class StopFailed(SequenceAborted, code="stop_failed"):
    """The old run could not be stopped (verdict ``STOP_FAILED``); ``survivors``: pids still alive
    (empty when unknown)."""

    verdict = "STOP_FAILED"

    def __init__(self, job: str, survivors: Sequence[int], detail: str = "", *, line: str) -> None:
        self.survivors = list(survivors)
        self.detail = detail
        pids = ", ".join(str(p) for p in self.survivors) or "none listed"
        tail = f" ({detail})" if detail else ""
        text = f"could not stop {job}: still alive: pid {pids}{tail} - not relaunching"
        super().__init__(job, text, line=line)


class LaunchFailed(SequenceAborted, code="launch_failed"):
    """The launch (or the cache clearing or patching before it) failed (verdict ``LAUNCH_FAILED``)."""

    verdict = "LAUNCH_FAILED"

    def __init__(self, job: str, detail: str, *, line: str) -> None:
        self.detail = detail
        super().__init__(job, f"launch of {job} failed: {detail}", line=line)


class PatchChanged(PreflightFailed, code="patch_changed"):
    """A patch file no longer has the SHA-256 that was approved (the two-person rule): the run
    stops at pre-flight (verdict ``PREFLIGHT_FAILED``, check ``approval``).  ``approved`` and
    ``found`` are 64 hex digits; ``found`` is empty when the file cannot be read."""

    def __init__(self, job: str, patch: str, approved: str, found: str, *, line: str) -> None:
        self.patch = patch
        self.approved = approved
        self.found = found
        super().__init__(job, "approval", patch_changed(patch, approved, found), line=line)


def patch_changed(patch: str, approved: str, found: str) -> str:
    """The detail of :class:`PatchChanged`: both hashes, their first 12 hex digits."""
    now = f"sha256 {found[:12]} now" if found else "unreadable now"
    return f"patch changed since approval: {patch} was approved as sha256 {approved[:12]}, {now}"


class RunCancelled(SequenceAborted, code="run_cancelled", exit_code=ExitCode.CANCELLED):
    """A run was cancelled at a step boundary (verdict ``CANCELLED``); its evidence is its text.
    ``after_step``: the last step done (a :class:`pipeline.verdict.Step` value), None if none."""

    verdict = "CANCELLED"

    def __init__(self, job: str, run_id: str, after_step: str | None, *, line: str) -> None:
        self.run_id = run_id
        self.after_step = after_step
        done = "before anything was changed" if after_step is None else f"after step {after_step}"
        tail = "" if after_step is None else " - the job may be stopped"
        super().__init__(job, f"run {run_id} for {job} cancelled {done}{tail}", line=line)
        self.evidence = self.message


class UnknownRun(PitstopError, code="unknown_run", exit_code=ExitCode.USAGE):
    """No run record with that id."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        super().__init__(f"no run {run_id}")


class IllegalTransition(PitstopError, code="illegal_transition"):
    """A state change its store refuses: ``what`` (``run r-42``, ``lock job:dflash``) is ``current``
    (``finished``, ``free``), so it cannot do ``wanted`` (``finish``, ``release``)."""

    def __init__(self, what: str, current: str, wanted: str) -> None:
        self.what = what
        self.current = current
        self.wanted = wanted
        super().__init__(f"{what} is {current}: it cannot {wanted} - reload it and try again")


class StateUnavailable(PitstopError, code="state_unavailable"):
    """Redis did not answer or refused a command (``detail``: the Redis client's error)."""

    def __init__(self, detail: str) -> None:
        self.detail = detail
        super().__init__(f"run state unavailable (Redis): {detail} - check that [redis] url answers")


class SlackUnavailable(PitstopError, code="slack_unavailable", exit_code=ExitCode.USAGE):
    """Slack refused the tokens or could not be reached at start-up (``pitstop serve``): the Web
    API ``method`` that failed, Slack's ``error`` code or the connection error, and ``unreachable``
    (True: no answer came, the network's fault, not the tokens')."""

    def __init__(self, method: str, error: str, *, unreachable: bool = False) -> None:
        self.method = method
        self.error = error
        self.unreachable = unreachable
        fix = (
            "Slack could not be reached (the tokens were not checked): check this host's network, DNS "
            "and proxy (HTTPS_PROXY), and SLACK_API_URL if set"
            if unreachable
            else "check SLACK_BOT_TOKEN / SLACK_APP_TOKEN (and SLACK_API_URL if set)"
        )
        super().__init__(f"Slack {method} failed: {error} - {fix}")


class GroupsUnknown(PitstopError, code="groups_unknown", exit_code=ExitCode.DENIED):
    """Who is in which Slack user group is not known well enough to decide an approval, so it is
    refused (fails closed): Slack's listing has failed for longer than a listing is trusted
    (``age``: seconds since the last good one; None: never listed), or the surface cannot list
    them at all (``surface``: its name)."""

    def __init__(self, age: float | None, surface: str = "") -> None:
        self.age = age
        self.surface = surface
        if surface:
            why = f"{surface} cannot read Slack user groups, which [auth] or the approvers name - decide it in Slack"
        else:
            when = "never listed" if age is None else f"last listed {age:.0f} s ago"
            why = (
                f"Slack's user groups cannot be read (usergroups.list keeps failing; {when}), so approvals "
                "are refused until they can be - check the token's usergroups:read scope and Slack's status"
            )
        super().__init__(f"{why}; nothing was decided")


class UnknownHost(PitstopError, code="unknown_host", exit_code=ExitCode.USAGE):
    """A host ``name`` that is not configured (``known``: the configured names)."""

    def __init__(self, name: str, known: Sequence[str]) -> None:
        self.name = name
        self.known = list(known)
        super().__init__(f"no host {name!r} in the configuration (known: {', '.join(self.known) or 'none'})")


class HostAuthRejected(HostUnreachable, code="host_auth_rejected"):
    """The host answered but refused the login as ``user`` (keys, user); a kind of unreachable."""

    def __init__(self, host: str, user: str, reason: str) -> None:
        self.user = user
        text = f"host {host} refused login as {user}: {reason} - check client_keys and the host's authorized_keys"
        super().__init__(host, reason, text)


class GpuQueryFailed(RemoteError, code="gpu_query_failed"):
    """``nvidia-smi`` could not be run or its output read."""

    def __init__(self, host: str, detail: str) -> None:
        self.detail = detail
        super().__init__(host, f"on {host}: cannot query GPUs with nvidia-smi: {detail}")
