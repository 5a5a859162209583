"""All text a person reads, as small functions that return strings.

One place for wording (as Bolt's ``logger/messages.py``), so tests compare against these
functions and every surface (Slack, console, CLI) says the same thing.  Sections are
grouped by the concept that speaks; keep each function small and free of I/O.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

# --- config and CLI ---------------------------------------------------------------------------


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


def demo_not_built() -> str:
    """Placeholder shown by ``make demo`` before the demo exists."""
    return "the demo is not built yet - checked the example config instead"


# --- remote execution -------------------------------------------------------------------------


# --- the restart sequence ---------------------------------------------------------------------


def missing_env(name: str) -> str:
    """A required environment variable is unset."""
    return f"{name} is not set - export it (secrets are read from the environment only)"


# --- the demo ---------------------------------------------------------------------------------


def demo_bad_line(lineno: int, line: str, expected: str) -> str:
    """A demo script line that is not a command or a well-formed directive."""
    return f"demo script line {lineno}: {line!r} - expected {expected}"


def demo_wait_timed_out(kind: str, job: str, within: float) -> str:
    """A ``wait`` directive's event did not come in time."""
    return f"no {kind} for {job} within {within:g} s"


def demo_unexpected(lineno: int, what: str) -> str:
    """A demo step did not behave as expected (line 0: the demo's own start of the job)."""
    where = f"demo step at line {lineno}" if lineno else "the demo's initial start of the job"
    return f"{where} did not behave as expected: {what}"


def demo_done(steps: int, seconds: float) -> str:
    """The demo's last line when every step behaved."""
    return f"demo complete: {steps} steps behaved as expected in {seconds:.0f} s"


# --- Slack and console surfaces (bot/blocks.py, bot/slack_app.py, bot/console.py) -----------


def slack_earlier_omitted(chars: int) -> str:
    """The visible marker in front of a log cut to fit a Slack section."""
    return f"… ({chars:,} earlier characters omitted)"


def slack_later_omitted(chars: int) -> str:
    """The visible marker after text cut to fit a Slack section."""
    return f"… ({chars:,} more characters omitted)"


def slack_rows_omitted(rows: int) -> str:
    """A table cut to fit one Slack message."""
    return f"… ({rows:,} more rows omitted)"


def slack_blocks_omitted(blocks: int) -> str:
    """A reply cut to Slack's 50 blocks per message."""
    return f"… ({blocks:,} more sections omitted - Slack shows at most 50 per message)"


def slack_continued(more: int) -> str:
    """The end of the first message of an answer split over several."""
    return f"… continued in {more} more message{'s' if more != 1 else ''} below"


def slack_attached(sections: int) -> str:
    """The end of a split answer too long even for several messages."""
    return f"… ({sections:,} more sections in the attached text file)"


def slack_part(index: int, total: int, title: str) -> str:
    """The head of a later message of a split answer."""
    return f"({index}/{total}) {title}"


def slack_untitled() -> str:
    """What an empty reply shows (Slack refuses empty text)."""
    return "(no text)"


def slack_home_title() -> str:
    """The heading of Pitstop's App Home tab."""
    return "Pitstop - jobs"


def slack_home_no_role() -> str:
    """The App Home of someone who holds no role."""
    return "you hold no Pitstop role yet - ask an admin to add you to [auth] viewers"


def slack_home_updated(when: str) -> str:
    """The App Home tab's footer."""
    return f"updated {when} · type `/train help` for commands"


def slack_not_posted(where: str, error: str) -> str:
    """A team-visible post that Slack refused (logged, never shown in Slack)."""
    return f"Slack refused a post to {where}: {error}"


def slack_gave_up(attempts: int) -> str:
    """Why a post was given up after its retries."""
    return f"gave up after {attempts} tries"


def status_delivery_failure(line: str, ago: str) -> str:
    """``status``'s line about the last post Slack refused."""
    return f"last Slack delivery failure {ago}: {line}"


def serve_listening(url: str) -> str:
    """``pitstop serve`` is up (HTTP mode)."""
    return f"serving Slack on {url} (POST /slack/events, GET /healthz)"


def serve_socket_connected() -> str:
    """``pitstop serve --socket`` is up."""
    return "connected to Slack over Socket Mode"


def console_prompt() -> str:
    """The console chat's input prompt."""
    return "pitstop> "


def console_confirm() -> str:
    """The console's question for a reply that asks for confirmation."""
    return "confirm? [y/N] "


def console_button(label: str, action: str) -> str:
    """A button the console cannot click, shown as a hint."""
    return f"[{label}] ({action})"


def console_bye() -> str:
    """The console's last line."""
    return "bye"


# --- handlers: run view, grammar, auth, lock, confirmation, dispatch (handlers/) ---------------


def who(user: str) -> str:
    """A Slack user id as a mention (``<@U012AB>``); any other requester (``console``) as it is."""
    if user.startswith(("U", "W")) and user[1:].isalnum() and user.isupper() and len(user) > 2:
        return f"<@{user}>"
    return user


def patch_phrase(patches: Sequence[str]) -> str:
    """``topk patch`` / ``topk and fast patches`` / ``a, b and c patches``."""
    names = list(patches)
    if len(names) == 1:
        return f"{names[0]} patch"
    return f"{', '.join(names[:-1])} and {names[-1]} patches"


def run_headline(
    run_id: str, action: str, job: str, user: str, patches: Sequence[str], fresh_cache: bool
) -> str:
    """The headline of a run's live message: ``r-42: restart of dflash by <@U1> with topk patch``."""
    extra = []
    if patches:
        extra.append(f"with {patch_phrase(patches)}")
    if fresh_cache:
        extra.append("fresh cache")
    tail = (" " + ", ".join(extra)) if extra else ""
    return f"{run_id}: {action} of {job} by {who(user)}{tail}"


def run_verdict_fallback(run_id: str, job: str, verdict: str) -> str:
    """A verdict line for a run whose record carries a verdict but no line."""
    return f"{run_id}: {job} {verdict}"


def run_lock_lost(job: str) -> str:
    """The sequence lost its lock (expired or forced) while it ran."""
    return (
        f"warning: the lock on {job} was lost while this run held it (expired or forced by unlock) - "
        "another restart may have started; what follows is still this run's true outcome"
    )


def run_evidence_title(job: str) -> str:
    """The title of the evidence (log tail) under a verdict."""
    return f"evidence from {job}"


def parse_unknown(
    kind: str, given: str, suggestions: Sequence[str], known: Sequence[str], where: str = ""
) -> str:
    """An unknown name: ``unknown job 'dflsh' — did you mean 'dflash'? (known: dflash, eagle)``.

    :param kind: what was looked up (``job``, ``host``, ``command``, ``patch``).
    :param where: what it was looked up in (``for dflash``), or empty.
    """
    hint = f" — did you mean {' or '.join(repr(s) for s in suggestions)}?" if suggestions else ""
    listing = f"(known: {', '.join(known)})" if known else "(none configured)"
    at = f" {where}" if where else ""
    return f"unknown {kind} {given!r}{at}{hint} {listing}"


def duration_text(seconds: int) -> str:
    """Whole seconds as the largest exact unit: ``7200`` → ``2h``, ``90`` → ``90s``."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def parse_usage(verb: str, usages: Sequence[str]) -> str:
    """Wrong arguments for a verb: its usage line(s)."""
    head = "usage: "
    pad = "\n" + " " * len(head)
    return head + pad.join(usages) + f"\n(type `help {verb}` for examples)"


def parse_out_of_range(what: str, value: int, low: int, high: int) -> str:
    """A number outside its bounds."""
    return f"{what} must be between {low} and {high}, got {value}"


def parse_bad_duration(given: str, longest: str) -> str:
    """A duration that is not one."""
    return f"{given!r} is not a duration - use e.g. 90s, 30m, 2h or 1d (at most {longest})"


def parse_duration_out_of_range(given: str, longest: str) -> str:
    """A duration outside its bounds."""
    return f"duration {given!r} is out of range - give at least 1s and at most {longest}"


def parse_added_and_removed(patches: Sequence[str]) -> str:
    """The same patch asked both with and without."""
    return f"patch {', '.join(repr(p) for p in patches)} cannot be both added and removed"


def parse_for_needs_off(job: str) -> str:
    """``watch JOB on for 2h``: a duration only makes sense when pausing."""
    return f"`for DURATION` pauses watching for a while: say `watch {job} off for 2h`"


def parse_too_long(limit: int) -> str:
    """A request longer than any command."""
    return f"that is too long for a command (at most {limit} characters) - type `help`"


def help_title() -> str:
    """The heading of ``help``."""
    return "Pitstop commands"


def help_footer(command: str) -> str:
    """The last line of ``help``."""
    return f"type `{command} help VERB` for one command; names ignore case; roles: viewer < operator < admin"


def help_verb_title(usage: str) -> str:
    """The heading of ``help VERB``."""
    return f"usage: {usage}"


def help_role(role: str) -> str:
    """Who may use a verb."""
    return f"needs the {role} role"


def denied(user: str, verb: str, job: str | None, role: str) -> str:
    """A request refused for lack of a role."""
    target = f" {job}" if job else ""
    return (
        f"{who(user)} may not `{verb}{target}` - it needs the {role} role "
        "(roles come from [auth] in the config, or [jobs.NAME.auth] for one job)"
    )


def in_flight(action: str, job: str, user: str, seconds: float, step: str) -> str:
    """A restart refused because another is in flight (the exact wording people learn to read)."""
    return (
        f"{action} of {job} already in flight - started by {who(user)} {int(seconds)} s ago, now at: {step}"
    )


def lock_free(job: str) -> str:
    """``lock JOB`` when nothing holds it."""
    return f"no restart of {job} in flight - the lock is free"


def lock_held(scope: str, action: str, job: str, user: str, seconds: float, step: str, run_id: str) -> str:
    """``lock JOB`` when something holds it."""
    run = f" (run {run_id})" if run_id else ""
    return (
        f"{scope} is locked: {action} of {job}{run} started by {who(user)} {int(seconds)} s ago, "
        f"now at: {step}"
    )


def lock_since(when: str) -> str:
    """When a lock was taken."""
    return f"held since {when}"


def unlocked(scope: str, user: str, holder: str | None) -> str:
    """``unlock JOB`` forced the lock free."""
    was = f" (was held by {who(holder)})" if holder else ""
    return f"lock on {scope} released by {who(user)}{was}"


def unlock_not_held(scope: str) -> str:
    """``unlock JOB`` when nothing held the lock."""
    return f"{scope} was not locked - nothing to release"


def duplicate_delivery() -> str:
    """A repeated delivery of a request that was already acted on."""
    return "already handled (a repeated delivery of the same request) - nothing was done again"


def queued(run_id: str, job: str) -> str:
    """The quick answer to restart/start/stop: the run is under way."""
    return f"queued run {run_id} for {job}"


def queued_detail(action: str, channel: str | None) -> str:
    """Where the run's steps will appear."""
    where = f" in <#{channel}>" if channel else ""
    return f"the {action} runs step by step{where}; the verified result follows in its thread"


def confirm_ask(text: str, job: str, seconds: float) -> str:
    """A job configured with ``confirm = true`` asks before acting."""
    return f"`{text}` - {job} asks for confirmation: confirm within {seconds:g} s or it is cancelled"


def confirm_button() -> str:
    """The label of the confirm button."""
    return "Confirm"


def cancel_button() -> str:
    """The label of the cancel button."""
    return "Cancel"


def show_log_button() -> str:
    """The label of the show-log button."""
    return "Show log"


def confirm_expired(text: str, seconds: float) -> str:
    """No confirmation came in time."""
    return f"not confirmed within {seconds:g} s - `{text}` was cancelled, nothing was done"


def confirm_gone() -> str:
    """A click on a confirmation that no longer exists."""
    return "this confirmation has expired or was already answered - nothing was done"


def confirm_not_yours(owner: str) -> str:
    """Someone else clicked another person's confirmation."""
    return f"only {who(owner)}, who asked, can answer this confirmation"


def confirm_cancelled(text: str, user: str) -> str:
    """The requester declined their own confirmation."""
    return f"`{text}` cancelled by {who(user)} - nothing was done"


def cancel_requested(run_id: str, job: str) -> str:
    """``cancel JOB``: the run stops at its next step boundary."""
    return f"cancel requested for run {run_id} of {job} - it stops at the next step boundary"


def cancel_nothing(job: str) -> str:
    """``cancel JOB`` with nothing in flight."""
    return f"no restart of {job} in flight - nothing to cancel"


def unknown_action(action: str) -> str:
    """A button whose action Pitstop does not know."""
    return f"unknown action {action!r} - nothing was done"


def launch_summary(run_id: str, job: str, pid: int | None, window: float) -> str:
    """Posted in the run's thread when the launch step ended well."""
    proc = f" as pid {pid}" if pid is not None else ""
    return f"{run_id}: {job} launched{proc} - the verdict follows in about {window:g} s"


def stop_summary(run_id: str, job: str) -> str:
    """Posted in the run's thread when a stop finished."""
    return f"{run_id}: {job} stopped"


def run_failed(run_id: str, job: str, detail: str) -> str:
    """A run's sequence ended with an error before (or at) launch."""
    return f"{run_id}: {job} failed - {detail}"


def status_title(count: int) -> str:
    """The heading of ``status``."""
    return f"status of {count} job{'s' if count != 1 else ''}"


def status_none() -> str:
    """``status`` with no jobs configured."""
    return "no jobs configured - add a [jobs.NAME] table to the config"


def logs_title(lines: int, path: str, job: str) -> str:
    """What a ``logs`` excerpt is."""
    return f"last {lines} lines of {path} ({job})"


def logs_empty(job: str) -> str:
    """``logs JOB`` when the log is empty or missing."""
    return f"the log of {job} is empty or missing"


def patches_title(job: str) -> str:
    """The heading of ``patches JOB``."""
    return f"patches of {job}"


def history_title(job: str | None, count: int) -> str:
    """The heading of ``history``."""
    of = f" of {job}" if job else ""
    return f"history{of}: last {count} run{'s' if count != 1 else ''}"


def history_none(job: str | None) -> str:
    """``history`` when nothing happened yet."""
    of = f" of {job}" if job else ""
    return f"no restarts{of} recorded yet"


def history_refusals_title() -> str:
    """The heading of the denied/refused part of ``history``."""
    return "recent denied, refused and failed requests"


def verb_unavailable(verb: str, module: str) -> str:
    """A verb whose implementation is not installed in this build."""
    return f"`{verb}` is not available in this build ({module} is missing)"


# --- remote execution, restart sequence, probes, GPUs (pipeline/remote.py, restart.py, ...) --


def host_key_missing_file(known_hosts: str) -> str:
    """Suffix for a rejected key when the known_hosts file does not exist."""
    return f"{known_hosts} (file not found)"


def connection_lost(host: str, argv: Sequence[str], detail: str) -> str:
    """The SSH connection dropped while a command ran (its outcome is unknown)."""
    return f"on {host}: connection lost while running `{_short(argv)}`: {detail} - its outcome is unknown"


def control_shell_killed(host: str, argv: Sequence[str], signal: str) -> str:
    """The shell running a remote command was killed by a signal."""
    return f"on {host}: the control shell running `{_short(argv)}` was killed by {signal}"


def channel_closed(host: str, argv: Sequence[str]) -> str:
    """A remote command's channel closed without an exit status or signal."""
    return f"on {host}: `{_short(argv)}` ended without an exit status (channel closed by the host)"


def sftp_failed(host: str, path: str, detail: str) -> str:
    """An SFTP upload failed."""
    return f"on {host}: cannot upload to {path}: {detail}"


def helper_failed(host: str, op: str, detail: str) -> str:
    """Pitstop's host helper failed or gave no answer."""
    return f"on {host}: Pitstop's host helper ({op}) failed: {detail}"


def helper_python_missing(host: str, python: str) -> str:
    """The host has no Python for the helper."""
    return f"on {host}: `{python}` not found - Pitstop's host helper needs Python 3.8+ on the job's side"


def _short(argv: Sequence[str], limit: int = 120) -> str:
    text = shlex.join(argv)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def engine_missing(engine: str) -> str:
    """A job's engine has no implementation registered (a wiring error)."""
    return f'no "{engine}" engine is registered with this Pitstop; restart Pitstop after an upgrade'


# verdict lines: exact, one line, for people and scripts alike (VERDICT DETAIL)


def verdict_running(
    seen: int,
    expected: int,
    pid: int,
    *,
    resumed_at: int | None = None,
    ignored_checkpoint: int | None = None,
) -> str:
    """``RUNNING 8/8 processes pid 4242``, ``…, resumed at step 12000`` or
    ``…, started from step 0 although checkpoint step 12000 exists``."""
    line = f"RUNNING {seen}/{expected} processes pid {pid}"
    if ignored_checkpoint is not None:
        return f"{line}, {resume_ignored(ignored_checkpoint)}"
    if resumed_at:
        return f"{line}, resumed at step {resumed_at}"
    return line


def resume_ignored(checkpoint_step: int) -> str:
    """``started from step 0 although checkpoint step 12000 exists``."""
    return f"started from step 0 although checkpoint step {checkpoint_step} exists"


def resume_warning(job: str, checkpoint_step: int, path: str) -> str:
    """The thread's warning for a run that ignored its checkpoint."""
    return (
        f"⚠ {job} {resume_ignored(checkpoint_step)} ({path}): the run is training again from the start; "
        "check its --checkpoint-dir / resume option"
    )


def checkpoint_fact(path: str, step: int | None, age_s: float) -> str:
    """Evidence line: ``checkpoint /srv/ckpt/latest.json: step 12000, written 3 min before the check``."""
    what = f"step {step}" if step is not None else "no step in its name"
    return f"checkpoint {path}: {what}, written {span(age_s)} before the check"


def verdict_wrong_count(seen: int, expected: int, pid: int) -> str:
    """``WRONG_COUNT 5/8 processes pid 4242``."""
    return f"WRONG_COUNT {seen}/{expected} processes pid {pid}"


def verdict_exited(code: int | None, signal: str | None, after: float) -> str:
    """``EXITED code 3 after 1.2 s``, ``EXITED signal SIGKILL after 1.2 s`` or ``EXITED after 1.2 s (exit code unknown)``."""
    if signal:
        return f"EXITED signal {signal} after {after:.1f} s"
    if code is not None:
        return f"EXITED code {code} after {after:.1f} s"
    return f"EXITED after {after:.1f} s (exit code unknown)"


def verdict_error_in_log(pid: int, line: str) -> str:
    """``ERROR_IN_LOG pid 4242: RuntimeError: CUDA out of memory``."""
    return f"ERROR_IN_LOG pid {pid}: {line[:200]}"


def verdict_no_progress(seen: int, expected: int, pid: int, silent_s: float) -> str:
    """``NO_PROGRESS 8/8 processes pid 4242 log silent 60 s``."""
    return f"NO_PROGRESS {seen}/{expected} processes pid {pid} log silent {silent_s:.0f} s"


def verdict_preflight_failed(check: str, detail: str) -> str:
    """``PREFLIGHT_FAILED patch: topk does not apply: …``."""
    return f"PREFLIGHT_FAILED {check}: {detail}"


def verdict_stop_failed(survivors: Sequence[int], detail: str) -> str:
    """``STOP_FAILED survivors pid 4242, 4243: …``."""
    pids = ", ".join(str(p) for p in survivors)
    head = f"STOP_FAILED survivors pid {pids}" if pids else "STOP_FAILED"
    return f"{head}: {detail}" if detail else head


def verdict_launch_failed(detail: str) -> str:
    """``LAUNCH_FAILED cannot start ./run.sh: …``."""
    return f"LAUNCH_FAILED {detail}"


def verdict_stale_record(pid: int, then: str) -> str:
    """``STALE_RECORD pid 4242 not signalled (start time differs); then: RUNNING 8/8 processes pid 5000``."""
    return f"STALE_RECORD pid {pid} not signalled (start time differs); then: {then}"


def verdict_cancelled(after_step: str | None) -> str:
    """``CANCELLED before stop`` (nothing changed) or ``CANCELLED after patch`` (job stopped)."""
    if after_step is None:
        return "CANCELLED before stop - nothing was changed"
    return f"CANCELLED after {after_step} - the job is stopped and was not relaunched"


def verdict_interrupted(step: str | None, found: str | None = None) -> str:
    """``INTERRUPTED during stop: the old run (pid 4242) is still alive, 8/8 processes``.

    :param step: the step the run was in when its owner died.
    :param found: what a probe of the host found (:func:`interrupted_found`); None when no
        probe was made (the sequence was cancelled by its own process).
    """
    if found is None:
        return f"INTERRUPTED during {step or 'start'} - Pitstop stopped before the sequence finished"
    return f"INTERRUPTED during {step or 'start'}: {found}"


def interrupted_found(step: str | None, old_pid: int | None, state: str, count: int, expected: int) -> str:
    """What the host showed when a run cut off before its launch was taken over.

    :param step: the step it was in (``stop``: ``old_pid`` is the run being stopped).
    :param state: the recorded pid's state: ``alive``, ``gone``, ``stale`` or ``none`` (no record).
    """
    procs = f"{count}/{expected} processes"
    if old_pid is None or state == "none":
        return f"no recorded run is up, {procs} match the job"
    who = "the old run" if step in (None, "preflight", "stop") else "the recorded run"
    if state == "alive":
        return f"{who} (pid {old_pid}) is still alive, {procs}"
    if state == "stale":
        return f"{who} (pid {old_pid}) is gone (its pid was reused), {procs}"
    return f"{who} (pid {old_pid}) is gone, {procs}"


def interrupted_unknown(error: str) -> str:
    """The job's state could not be probed when its run was taken over."""
    return f"the job's state on its host is unknown ({error})"


def interrupted_after_launch(pid: int, state: str, count: int, expected: int) -> str:
    """``INTERRUPTED after launch: pid 5151 running 8/8 (unverified)``: the owner died after the launch."""
    if state == "alive":
        return f"INTERRUPTED after launch: pid {pid} running {count}/{expected} (unverified)"
    if state == "unknown":
        return f"INTERRUPTED after launch: pid {pid} state unknown (unverified)"
    return f"INTERRUPTED after launch: pid {pid} gone, {count}/{expected} (unverified)"


def unknown_job_now(job: str) -> str:
    """A run's job is no longer in the configuration."""
    return f"job {job} is no longer configured"


# step details (one line each, shown beside the step)


def step_preflight_ok(checks: Sequence[str]) -> str:
    """All pre-flight checks passed."""
    return "ok: " + ", ".join(checks)


def step_stop_nothing() -> str:
    """Nothing of the job was running."""
    return "nothing was running"


def step_stopped(count: int, seconds: float, killed: Sequence[int], stop_timeout: float) -> str:
    """How the old run was stopped."""
    text = f"stopped {count} process{'es' if count != 1 else ''} in {seconds:.1f} s"
    if killed:
        pids = ", ".join(str(p) for p in killed)
        text += f" (SIGKILL after {stop_timeout:g} s to pid {pids}, which ignored SIGTERM)"
    else:
        text += " (SIGTERM)"
    return text


def stale_record(pid: int, recorded: int | None, found: int | None) -> str:
    """The recorded pid now belongs to another process: it is not signalled."""
    return (
        f"stale record: pid {pid} now belongs to another process (start time {found}, recorded {recorded}) "
        "- not signalled"
    )


STALE_PREFIX = "stale record:"


def gpu_memory_held(pids: Sequence[int], seconds: float) -> str:
    """Old processes still hold GPU memory after the stop."""
    listed = ", ".join(str(p) for p in pids)
    return f"GPU memory still held by old pid {listed} after {seconds:.0f} s - not relaunching"


def gpu_memory_freed(seconds: float) -> str:
    """GPU memory of the old run was released."""
    return f"GPU memory released ({seconds:.1f} s)"


def step_cache_skipped() -> str:
    """No fresh cache was asked for."""
    return "not asked for"


def step_cache_none() -> str:
    """A fresh cache was asked for but the job has no clear_cache paths."""
    return "asked for, but the job has no clear_cache paths"


def step_cache_cleared(cleared: Sequence[tuple[str, int, int, bool]]) -> str:
    """``/srv/cache: 120 files, 3.4 GB removed`` per path (path, files, bytes, missing)."""
    parts = []
    for path, files, size, missing in cleared:
        parts.append(f"{path}: not present" if missing else f"{path}: {files} files, {_bytes(size)} removed")
    return "; ".join(parts)


def _bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if size < 1000 or unit == "TB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{n} B"


def step_patches(applied: Sequence[str], reverted: Sequence[str], in_effect: Sequence[str]) -> str:
    """What the patch step changed and what is in effect after it."""
    parts = []
    if applied:
        parts.append("applied " + ", ".join(applied))
    if reverted:
        parts.append("reverted " + ", ".join(reverted))
    if not parts:
        parts.append("no change")
    parts.append("in effect: " + (", ".join(in_effect) or "none"))
    return "; ".join(parts)


def patch_failed(detail: str) -> str:
    """A patch did not apply after the stop (pre-flight had passed)."""
    return f"patch step failed, job not relaunched: {detail}"


def step_launched(pid: int, log: str, log_size: int) -> str:
    """The launch returned the new process."""
    return f"pid {pid} (new session), log {log} from byte {log_size}"


def step_verify_waiting(start_window: float) -> str:
    """Verification is scheduled."""
    return f"checking for {start_window:g} s after launch"


def launch_hung(timeout: float, state: str) -> str:
    """The launch channel did not return."""
    return f"launch channel hung for {timeout:g} s; process state: {state}"


def already_running(job: str, pids: Sequence[int]) -> str:
    """``start`` refused because the job runs."""
    listed = ", ".join(str(p) for p in pids[:10])
    return f"{job} is already running (pid {listed}) - use restart"


def log_since_launch_empty() -> str:
    """Evidence when the job wrote nothing since its launch."""
    return "(no log output since launch)"


def interrupted_step() -> str:
    """Detail of the step that was running when Pitstop stopped."""
    return "Pitstop stopped during this step"


def cancelled_step() -> str:
    """Detail of a step not run because the run was cancelled."""
    return "cancelled"


def not_launched_yet() -> str:
    """verify() on a run that has no launched process."""
    return "nothing was launched in this run"


# --- end of remote execution / restart section -------------------------------------------------


# --- watching, alerts, verdict delivery, scheduler (pipeline/watch.py, handlers/alerts.py,
# --- handlers/watching.py, handlers/verdicts.py, bot/scheduler.py) -----------------------------


def slack_mention(target: str) -> str:
    """Slack's mention syntax for a user (``U…``/``W…``), a user group (``S…``) or ``here``/``channel``."""
    t = target.strip().lstrip("@")
    if t in ("here", "channel", "everyone"):
        return f"<!{t}>"
    if t.startswith("S"):
        return f"<!subteam^{t}>"
    if t.startswith(("U", "W")):
        return f"<@{t}>"
    return t


def span(seconds: float) -> str:
    """A length of time for people: ``45 s``, ``12 min``, ``3 h 5 min``, ``2 d 4 h``."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s} s"
    m = s // 60
    if m < 60:
        return f"{m} min"
    h, m = divmod(m, 60)
    if h < 24:
        return f"{h} h {m} min" if m else f"{h} h"
    d, h = divmod(h, 24)
    return f"{d} d {h} h" if h else f"{d} d"


def minutes(seconds: float) -> str:
    """Whole minutes, at least 1: ``resolved after 3 min``."""
    return f"{max(1, round(seconds / 60))} min"


def alert_title(kind: str, job: str, host: str, count: int, expected: int, quiet_for: float | None) -> str:
    """The headline of a new alert, by incident kind."""
    if kind == "dead":
        return f"{job} is down: no processes left on {host} (expected {expected})"
    if kind == "degraded":
        return f"{job} is degraded: {count}/{expected} processes on {host}"
    if kind == "stalled":
        idle = f" for {span(quiet_for)}" if quiet_for is not None else ""
        return f"{job} has stalled: alive ({count}/{expected}) but no new log output{idle}"
    if kind == "stuck_rank":
        return f"{job} has a stuck rank on {host}: one rank stopped advancing while the others wait"
    if kind == "unreachable":
        return f"host {host} unreachable - cannot check {job}"
    if kind == "crash_loop":
        return f"{job} is crash-looping on {host} - automatic restarts given up"
    return f"{job}: {kind} on {host}"


def alert_resolved_title(kind: str, job: str, after: float) -> str:
    """The alert's headline once its incident resolved."""
    return f"resolved: {job} was {kind.replace('_', ' ')} for {minutes(after)}"


def alert_mention_line(mention: str | None, job: str) -> str:
    """The first line of an alert: who is called, and how to silence it."""
    who = f"{mention} " if mention else ""
    return f"{who}`ack {job}` to acknowledge, `watch {job} off for 2h` to pause watching"


def alert_detected_cause(cause: str) -> str:
    """The cause found in the log."""
    return f"detected cause: {cause}"


def alert_no_log() -> str:
    """The log tail could not be read for an alert."""
    return "the log could not be read"


def alert_log_title(lines: int, path: str) -> str:
    """The caption of an alert's log excerpt."""
    return f"last {lines} lines of {path}"


def alert_field_labels() -> dict[str, str]:
    """Labels of an alert's fields, by field id."""
    return {
        "job": "job",
        "host": "host",
        "processes": "processes",
        "last_pid": "last PID",
        "last_alive": "last seen alive",
        "exit": "exit cause",
        "error": "connection error",
        "opened": "since",
        "acked": "acknowledged by",
        "auto": "automatic restarts",
    }


def alert_when(clock: str, ago: float) -> str:
    """A moment as clock time and age: ``14:02:11 UTC (3 min ago)``."""
    return f"{clock} ({span(ago)} ago)"


def alert_exit_cause(code: int | None, signal: str | None) -> str:
    """How the job's launched process ended, from its waiter's record."""
    if signal:
        hint = " (the kernel's OOM killer, or someone's kill -9)" if signal == "SIGKILL" else ""
        return f"killed by {signal}{hint}"
    if code is None:
        return "ended (status unknown)"
    return f"exited with code {code}"


def alert_never_seen() -> str:
    """The job was never seen alive by the watcher."""
    return "not seen by the watcher"


def incident_resolved(job: str, kind: str, after: float, resolution: str, count: int, expected: int) -> str:
    """The thread reply when an incident resolves."""
    if resolution == "stopped":
        return f"resolved after {minutes(after)}: {job} was stopped on purpose"
    if resolution == "reachable":
        return f"resolved after {minutes(after)}: the host of {job} is reachable again"
    return f"resolved after {minutes(after)}: {job} is running again ({count}/{expected} processes)"


def incident_reminder(job: str, kind: str, open_for: float) -> str:
    """The thread re-post of an incident still open and not acknowledged."""
    return f"still {kind.replace('_', ' ')}: {job}, for {span(open_for)} - `ack {job}` to stop reminders"


def incident_changed(job: str, old: str, new: str, count: int, expected: int) -> str:
    """The open incident became another kind."""
    return f"{job} is now {new.replace('_', ' ')} (was {old.replace('_', ' ')}): {count}/{expected} processes"


def incident_acked(job: str, user: str) -> str:
    """The thread note and reply of ``ack JOB``."""
    return f"acknowledged by {slack_mention(user)} - no more reminders for {job} until it resolves"


def incident_already_acked(job: str, user: str) -> str:
    """``ack JOB`` on an incident someone already acknowledged."""
    return f"the {job} incident was already acknowledged by {slack_mention(user)}"


def incident_none_open(job: str) -> str:
    """``ack JOB`` when nothing is open."""
    return f"no open incident for {job} - nothing to acknowledge"


def auto_restart_planned(job: str, delay: float, attempt: int, limit: int) -> str:
    """An alert's note that an automatic restart will follow."""
    return f"automatic restart {attempt}/{limit} of {job} in {span(delay)}"


def auto_restart_started(job: str, attempt: int, limit: int, answer: str) -> str:
    """The incident thread note when an automatic restart is requested."""
    return f"automatic restart {attempt}/{limit} of {job}: {answer}"


def auto_restart_not_on(job: str, crash_class: str, summary: str) -> str:
    """The give-up alert when the crash's class is not restarted automatically."""
    return (
        f"{job} failed with {crash_class} - not restarted automatically ({crash_class} is not in "
        f"auto_restart.on); restart it by hand once the cause is fixed. Cause: {summary}"
    )


def auto_restart_repeat(job: str, exc_type: str, step: int | None, summary: str) -> str:
    """The give-up alert when the same Python exception came back at the same step."""
    return (
        f"{job} failed again with {exc_type} at step {step} - the same exception at the same step is a "
        f"bug a restart will not fix, so no more automatic restarts; fix it and restart by hand. Cause: {summary}"
    )


def crash_loop_gave_up(job: str, restarts: int, within: float) -> str:
    """The single give-up alert of a crash loop."""
    return (
        f"{job} crashed again after {restarts} automatic restarts within {span(within)} - "
        "crash loop, giving up; restart it by hand once the cause is fixed"
    )


def watch_paused(job: str, until: str, seconds: float) -> str:
    """Reply of ``watch JOB off [for D]``."""
    return f"watching {job} paused for {span(seconds)} (until {until}) - `watch {job} on` resumes it"


def watch_resumed(job: str, was_off: bool) -> str:
    """Reply of ``watch JOB on``."""
    if was_off:
        return f"watching {job} again"
    return f"watching {job} (it was not paused)"


def watch_bad_state(state: str) -> str:
    """``watch JOB`` with something other than on/off."""
    return f"watch takes `on` or `off`, not {state!r}"


def watch_unknown_job(job: str, suggestion: str | None) -> str:
    """A watch/ack command naming a job that is not configured."""
    hint = f" - did you mean {suggestion}?" if suggestion else ""
    return f"no job called {job!r}{hint}"


def verdict_not_delivered(run_id: str, error: str) -> str:
    """A verification that failed to run (logged; retried later)."""
    return f"verification of {run_id} failed: {error} - retrying"


def scheduler_leader(instance: str, acquired: bool) -> str:
    """Log line: this process became, or stopped being, the scheduler leader."""
    return f"{instance} {'is now' if acquired else 'is no longer'} the scheduler leader"


# --- end of watching section -------------------------------------------------------------------


# --- digests and GPU reports (pipeline/digest.py, handlers/reports.py) --------------------------


def na(value: float | None, fmt: str = "{:,.0f}", unit: str = "") -> str:
    """A number formatted with ``fmt`` (and ``unit``), or ``n/a`` when it is unknown (never 0)."""
    return "n/a" if value is None else fmt.format(value) + unit


def signed_pct(change: float | None) -> str:
    """A change in percent as ``+5.2%`` / ``-3.0%``, or ``""`` when unknown."""
    return "" if change is None else f"{change:+.1f}%"


def human_duration(seconds: float | None) -> str:
    """``45 s``, ``12 min``, ``3 h 05 min``, ``2 d 04 h`` (``n/a`` when unknown)."""
    if seconds is None or seconds < 0:
        return "n/a"
    s = round(seconds)
    if s < 120:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min"
    if s < 86400:
        return f"{s // 3600} h {s % 3600 // 60:02d} min"
    return f"{s // 86400} d {s % 86400 // 3600:02d} h"


def human_bytes(n: float) -> str:
    """``512 B``, ``1.5 KiB``, ``8.0 MiB``, ``1.00 GiB``."""
    if n < 1024:
        return f"{n:.0f} B"
    if n < 1024**2:
        return f"{n / 1024:.1f} KiB"
    if n < 1024**3:
        return f"{n / 1024**2:.1f} MiB"
    return f"{n / 1024**3:.2f} GiB"


def digest_title(job: str, tokens_per_s: float | None, change_pct: float | None) -> str:
    """``digest dflash: 1,234 tokens/s (+5.2%)``."""
    if tokens_per_s is None:
        return f"digest {job}: no throughput in this window"
    change = f" ({signed_pct(change_pct)})" if change_pct is not None else ""
    return f"digest {job}: {tokens_per_s:,.0f} tokens/s{change}"


def digest_targets(tokens_per_s: float | None, ranks: int) -> str:
    """The target ranks' own throughput, shown apart from the pipeline's."""
    return f"{na(tokens_per_s)} tokens/s over {ranks} rank(s), not added to the pipeline's"


def digest_silent_cell(last_seen: float | None) -> str:
    """A silent rank's cell in the digest's rank table: ``silent since 02:06:13 UTC``."""
    from datetime import UTC, datetime

    if last_seen is None:
        return "silent (no metric line seen yet)"
    return f"silent since {datetime.fromtimestamp(last_seen, UTC).strftime('%H:%M:%S')} UTC"


def digest_silent(ranks: Sequence[tuple[int, str, float | None]]) -> str:
    """The warning line naming the expected ranks without a metric line in the window."""
    named = "; ".join(f"rank {rank} ({role}) {digest_silent_cell(last)}" for rank, role, last in ranks)
    return f"{named}: no metric line in this window"


def digest_window(start: float | None, end: float | None, read: int, skipped: int) -> str:
    """The window a digest covers: time span of its metric lines and bytes read."""
    from datetime import UTC, datetime

    def clock(ts: float) -> str:
        return datetime.fromtimestamp(ts, UTC).strftime("%H:%M:%S")

    span = (
        f"{human_duration(end - start)} ({clock(start)}-{clock(end)} UTC)"
        if start is not None and end is not None
        else "no timestamps"
    )
    more = f", {human_bytes(skipped)} earlier not read" if skipped else ""
    return f"{span}, {human_bytes(read)} read{more}"


def digest_window_note(kind: str, path: str, max_bytes: int) -> str | None:
    """Why a window is not simply 'since the last digest' (``None`` when it is)."""
    notes = {
        "last_bytes": f"first digest of {path}: read its last {human_bytes(max_bytes)} at most",
        "repeat": "nothing new since the last scheduled digest - showing its window again",
        "truncated": f"{path} was truncated since the last digest - read from its start",
        "rotated": f"{path} was replaced (rotated) since the last digest - read the new file from its start",
    }
    return notes.get(kind)


def digest_skipped(skipped: int, max_bytes: int) -> str:
    """More was written than one digest reads."""
    return (
        f"{human_bytes(skipped)} of metric log written since the last digest were not read "
        f"(a digest reads the last {human_bytes(max_bytes)} at most)"
    )


def digest_no_lines(job: str, path: str, read: int) -> str:
    """The window held no metric lines."""
    return f"no metric lines for {job} in the {human_bytes(read)} read from {path}"


def digest_starved(queue_mean: float) -> str:
    """The drafters' hidden-state queue is ~empty: the targets cannot keep up."""
    return (
        f"drafters are starved: mean hidden-state queue depth {queue_mean:.2f} - "
        "the target GPUs cannot keep up"
    )


def digest_resets(count: int) -> str:
    """Token counters went down inside the window (a relaunch)."""
    return f"{count} token counter reset(s) in the window (a relaunch); counted from zero after each"


def digest_step_time(p50: float | None, p95: float | None) -> str:
    """``0.120 s / 0.245 s``."""
    return f"{na(p50, '{:.3f}', ' s')} / {na(p95, '{:.3f}', ' s')}"


def digest_step_time_targets(p50: float | None, p95: float | None) -> str:
    """The target ranks' step time, appended to the pipeline's (targets include queue waits)."""
    return f"; targets {digest_step_time(p50, p95)}"


def digest_queue(mean: float | None, peak: float | None) -> str:
    """Mean and max hidden-state queue depth."""
    return f"mean {na(mean, '{:.1f}')}, max {na(peak)}"


def digest_loss(last: float | None, mean: float | None) -> str:
    """Loss: last (mean over drafter ranks of each one's last line) and window mean."""
    return f"{na(last, '{:.3f}')} last, {na(mean, '{:.3f}')} mean"


def digest_topk(top1: float | None, top4: float | None, top8: float | None, change: str = "") -> str:
    """Top-1/4/8 accuracy in percent: the mean of each drafter rank's last line."""
    pct = "{:.1%}"
    tail = f" ({change})" if change else ""
    return f"{na(top1, pct)} / {na(top4, pct)} / {na(top8, pct)} (each drafter's last line){tail}"


def digest_restarts(count: int | None, ids: Sequence[str]) -> str:
    """Restarts during the window."""
    if count is None:
        return "n/a"
    if not count:
        return "none"
    return f"{count} ({', '.join(ids[:5])}{', …' if len(ids) > 5 else ''})"


def digest_no_gpu_data(reason: str) -> str:
    """A job with ``gpus`` whose host gave no GPU statistics (CPU host, nvidia-smi failing)."""
    return f"no GPU data: {reason}"


def digest_gpus_missing(indices: Sequence[int]) -> str:
    """Configured GPU indices nvidia-smi did not list."""
    return f"GPU index(es) {', '.join(str(i) for i in indices)} configured but not reported by nvidia-smi"


def digest_failed(job: str, detail: str) -> str:
    """A digest could not be built."""
    return f"digest {job}: could not be built - {detail}"


def digest_all_title(jobs: int) -> str:
    """Heading of ``digest`` without a job: one follow-up per job."""
    return f"digest of {jobs} job(s)"


def digest_no_jobs() -> str:
    """``digest`` with no jobs configured."""
    return "no jobs are configured - nothing to digest"


def digest_unknown_job(job: str, suggestions: Sequence[str]) -> str:
    """``digest NAME`` for a job that is not configured."""
    hint = f" - did you mean {' or '.join(suggestions)}?" if suggestions else ""
    return f"no job named {job}{hint}"


def gpus_title(host: str, count: int) -> str:
    """Heading of ``gpus HOST``."""
    return f"GPUs on {host}: {count}"


def gpus_unknown_host(host: str, suggestions: Sequence[str]) -> str:
    """``gpus NAME`` for a host that is not configured."""
    hint = f" - did you mean {' or '.join(suggestions)}?" if suggestions else ""
    return f"no host named {host}{hint}"


def gpus_unavailable(host: str, detail: str) -> str:
    """``gpus HOST`` when the host gave no GPU data."""
    return f"no GPU data from {host}: {detail}"


def gpus_no_processes() -> str:
    """No compute processes hold GPU memory."""
    return "no processes hold GPU memory"


def gpus_processes_unavailable(detail: str) -> str:
    """The GPU list came back but the process list did not."""
    return f"processes on the GPUs unknown: {detail}"


# --- end of digests section --------------------------------------------------------------------


# --- handlers (continued): status, history, patches, lock views (handlers/views.py) ------------


def ago(seconds: float) -> str:
    """``40 s ago``, ``5 min ago``, ``3 h ago``, ``2 d ago``."""
    s = max(0, int(seconds))
    if s < 120:
        return f"{s} s ago"
    if s < 7200:
        return f"{s // 60} min ago"
    if s < 172800:
        return f"{s // 3600} h ago"
    return f"{s // 86400} d ago"


def status_headers() -> tuple[str, ...]:
    """Columns of the ``status`` table."""
    return ("job", "state", "pid", "procs", "uptime", "last restart", "lock", "patches")


def status_last_run(run_id: str, action: str, when_ago: str, user: str, outcome: str) -> str:
    """A ``status`` cell: the job's last run."""
    return f"{run_id} {action} {when_ago} by {who(user)}: {outcome}"


def status_lock(action: str, user: str, step: str) -> str:
    """A ``status`` cell: who holds the lock."""
    return f"{action} by {who(user)}, at {step}"


def status_probe_failed(job: str, host: str, error: str) -> str:
    """A job whose host could not be probed for ``status``."""
    return f"{job}: state unknown - {host}: {error}"


def in_progress(step: str | None) -> str:
    """A run without verdict yet."""
    return f"in flight ({step})" if step else "in flight"


def history_headers() -> tuple[str, ...]:
    """Columns of the ``history`` runs table."""
    return ("run", "when", "who", "action", "patches", "verdict", "took")


def history_refusal_headers() -> tuple[str, ...]:
    """Columns of the ``history`` refused-requests table."""
    return ("when", "who", "request", "outcome", "why")


def patches_available(names: Sequence[str]) -> str:
    """``patches JOB``: the configured patches."""
    return ", ".join(names) if names else "none configured"


def patches_in_effect(names: Sequence[str]) -> str:
    """``patches JOB``: the patches applied now."""
    return ", ".join(names) if names else "none"


def patches_recorded_only(error: str) -> str:
    """``patches JOB`` could not ask the host; the recorded set is shown."""
    return f"could not check the workdir ({error}) - showing the set recorded by the last restart"


def field_available() -> str:
    """Field label."""
    return "available"


def field_in_effect() -> str:
    """Field label."""
    return "in effect"


def field_run() -> str:
    """Field label."""
    return "run"


def field_since() -> str:
    """Field label."""
    return "since"


def lock_forced_note(user: str) -> str:
    """Posted in a run's thread when ``unlock`` freed its lock."""
    return f"the lock of this run was forced free by {who(user)}"


def help_line(usage: str, summary: str, role: str) -> str:
    """One verb in ``help``."""
    return f"`{usage}` - {summary} ({role})"


def help_examples(examples: Sequence[str]) -> str:
    """Examples in ``help VERB``."""
    return "examples: " + "; ".join(f"`{e}`" for e in examples)


# --- end of handlers section -------------------------------------------------------------------


# --- handlers (continued) ------------------------------------------------------------------------


def run_done() -> str:
    """A finished run without a verdict (a stop that succeeded)."""
    return "done"


def awaiting_verdict() -> str:
    """A launched run whose verification is not due yet."""
    return "launched, awaiting verdict"


def demo_script_unreadable(path: str, reason: str) -> str:
    """The demo's ``--script`` file cannot be read."""
    return f"cannot read demo script {path}: {reason}"
