"""Errors: stable codes, the fields each was built from, its exact text, incident ids."""

from __future__ import annotations

import re

import pytest

import bot.demo.run
import handlers.grammar.commands
import handlers.request.auth
import pipeline.state.locks
from pipeline.errors import (
    ConfigError,
    ExitCode,
    GpuQueryFailed,
    HostAuthRejected,
    HostKeyRejected,
    HostUnreachable,
    LaunchFailed,
    PitstopError,
    PreflightFailed,
    RemoteTimeout,
    RunCancelled,
    SequenceAborted,
    SlackUnavailable,
    StopFailed,
    UnknownHost,
    UnknownRun,
    error_class,
    internal_error,
    new_incident_id,
)
from pipeline.verdict import Verdict

_SURFACES = (
    bot.demo.run,
    handlers.request.auth,
    handlers.grammar.commands,
    pipeline.state.locks,
)  # their errors are subclasses too


def _all_errors() -> list[type[PitstopError]]:
    found: list[type[PitstopError]] = []
    pending: list[type[PitstopError]] = [PitstopError]
    while pending:
        cls = pending.pop()
        found.append(cls)
        pending.extend(cls.__subclasses__())
    return found


def test_every_error_class_has_its_own_unique_code() -> None:
    """Each PitstopError class declares its own code, no two share one, and the code maps back to it."""
    classes = _all_errors()
    assert {"ParseError", "Denied", "InFlight", "DemoFailed"} <= {c.__name__ for c in classes}
    for cls in classes:
        assert "code" in vars(cls), f"{cls.__name__} has no code of its own"
        assert re.fullmatch(r"[a-z]+(_[a-z]+)*", cls.code), cls.code
        assert error_class(cls.code) is cls
    assert len({c.code for c in classes}) == len(classes)
    with pytest.raises(KeyError):
        error_class("no_such_code")


def test_remote_errors_keep_their_fields_and_read_as_before() -> None:
    """Remote errors keep host, reason, argv, timeout ... and their text is unchanged."""
    err = HostUnreachable("gpu1", "connection refused")
    assert (err.code, err.host, err.reason) == ("host_unreachable", "gpu1", "connection refused")
    assert err.message == "host gpu1 unreachable: connection refused"
    auth = HostAuthRejected("gpu1", "train", "permission denied")
    assert isinstance(auth, HostUnreachable) and (auth.user, auth.reason) == ("train", "permission denied")
    assert auth.message == (
        "host gpu1 refused login as train: permission denied - check client_keys and the host's authorized_keys"
    )
    key = HostKeyRejected("gpu1", "SHA256:abc", "/k")
    assert (key.fingerprint, key.known_hosts) == ("SHA256:abc", "/k")
    assert key.message == (
        "host gpu1 presented key SHA256:abc, which does not match /k - refusing to connect; "
        "if the host was rebuilt, verify the key and update known_hosts"
    )
    late = RemoteTimeout("gpu1", ["sleep", "a b"], 2.5, stdout="partial")
    assert (late.argv, late.timeout, late.stdout, late.exit_code) == (
        ("sleep", "a b"),
        2.5,
        "partial",
        ExitCode.CANCELLED,
    )
    assert late.message == "on gpu1: `sleep 'a b'` did not finish within 2.5 s"
    gpu = GpuQueryFailed("gpu1", "no nvidia-smi")
    assert gpu.message == "on gpu1: cannot query GPUs with nvidia-smi: no nvidia-smi" and gpu.detail
    host = UnknownHost("gpu9", ["gpu1", "gpu2"])
    assert host.message == "no host 'gpu9' in the configuration (known: gpu1, gpu2)"
    assert UnknownHost("x", []).message.endswith("(known: none)")


def test_other_errors_read_as_before() -> None:
    """Config, run and Slack errors keep their fields and exact text."""
    one = ConfigError(["pitstop.toml: line 3: bad"], "pitstop.toml")
    assert one.message == "pitstop.toml: line 3: bad" and one.exit_code is ExitCode.USAGE
    two = ConfigError(["a: bad", "b: bad"], "pitstop.toml")
    assert two.message == "pitstop.toml: invalid configuration\na: bad\nb: bad"
    assert two.problems == ["a: bad", "b: bad"] and two.source == "pitstop.toml"
    assert ConfigError(["a", "b"]).message == "invalid configuration\na\nb"
    assert UnknownRun("r-1").message == "no run r-1"
    slack = SlackUnavailable("auth.test", "invalid_auth")
    assert slack.message == (
        "Slack auth.test failed: invalid_auth - check SLACK_BOT_TOKEN / SLACK_APP_TOKEN (and SLACK_API_URL if set)"
    )


def test_sequence_errors_carry_their_verdict_and_line() -> None:
    """The restart steps' errors each lead to one verdict; the line is the run's evidence unless cancelled."""
    pre = PreflightFailed("dflash", "disk", "full", line="PREFLIGHT_FAILED disk: full")
    assert pre.message == "pre-flight check 'disk' failed for dflash: full - nothing was stopped"
    assert (Verdict(pre.verdict), pre.line, pre.evidence) == (
        Verdict.PREFLIGHT_FAILED,
        "PREFLIGHT_FAILED disk: full",
        "PREFLIGHT_FAILED disk: full",
    )
    stop = StopFailed("dflash", [1, 2], line="STOP_FAILED survivors pid 1, 2: x")
    assert stop.message == "could not stop dflash: still alive: pid 1, 2 - not relaunching"
    assert StopFailed("dflash", [], "gone", line="-").message == (
        "could not stop dflash: still alive: pid none listed (gone) - not relaunching"
    )
    assert Verdict(stop.verdict) is Verdict.STOP_FAILED and stop.survivors == [1, 2]
    launch = LaunchFailed("dflash", "no pid", line="LAUNCH_FAILED no pid")
    assert (
        launch.message == "launch of dflash failed: no pid"
        and Verdict(launch.verdict) is Verdict.LAUNCH_FAILED
    )
    before = RunCancelled("dflash", "r-1", None, line="CANCELLED before any step")
    assert before.message == "run r-1 for dflash cancelled before anything was changed"
    assert before.evidence == before.message and Verdict(before.verdict) is Verdict.CANCELLED
    after = RunCancelled("dflash", "r-1", "stop", line="-")
    assert after.message == "run r-1 for dflash cancelled after step stop - the job may be stopped"
    assert after.exit_code is ExitCode.CANCELLED
    assert all(
        issubclass(c, SequenceAborted) for c in (PreflightFailed, StopFailed, LaunchFailed, RunCancelled)
    )


def test_incident_ids_are_fresh_and_named_in_the_text() -> None:
    """One function mints incident ids (8 hex digits); the person's line names it."""
    ids = {new_incident_id() for _ in range(50)}
    assert len(ids) == 50 and all(re.fullmatch(r"[0-9a-f]{8}", i) for i in ids)
    assert internal_error("abcd1234") == (
        "something went wrong inside Pitstop (incident abcd1234); the details are in its log"
    )
