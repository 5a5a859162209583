"""The words a person reads from the surfaces in ``bot/``, in one catalogue (as Bolt's
``logger/messages.py``): constants for fixed words, small functions where words take values.

A leaf: it imports nothing of ``bot`` (every module of ``bot`` may import it), only the reply model
and :mod:`pipeline.fmt` for the words that need them.
"""

from __future__ import annotations

import os
from pathlib import Path

from pipeline import fmt

# --- Slack: the surface, split messages, refusals, the App Home, Socket Mode

SLACK_UNTITLED = "(no text)"  #: what an empty reply shows (Slack refuses empty text)
SLACK_HOME_TITLE = "Pitstop - jobs"  #: the heading of Pitstop's App Home tab


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


def refused_notice(what: str, channel: str, error: str) -> str:
    """The notice a person gets when Slack refused a post: what, where, Slack's error, and what to
    do about it, by Slack's error code."""
    if not channel:  # nowhere configured (``no_channel``)
        return f'"{what}" had no channel to go to - set [slack] announce_channel (or the job\'s channel)'
    where = f"<#{channel}>" if channel.startswith(("C", "G")) else channel
    fixes = {
        "not_in_channel": f"invite the bot: `/invite @pitstop` in {where}",
        "channel_not_found": (
            f"check the channel id {channel} in the config ([slack] announce_channel / jobs.*.channel), "
            "or `/invite @pitstop` if it is private"
        ),
        "is_archived": f"{where} is archived: unarchive it or point the config at another channel",
        "msg_blocks_too_long": "the message was too long for Slack - please report this",
        "outcome_unknown": f"Slack may have it or not: look in {where} (Pitstop does not post twice)",
        "restricted_action": (
            "posting there is restricted (read-only, threads only or admins only): allow the app "
            "to post in the channel's settings or point the config at another channel"
        ),
        "ekm_access_denied": (
            f"{where} is locked by an Enterprise Key Management policy: ask a Slack admin to "
            "restore access or point the config at another channel"
        ),
        "invalid_auth": "SLACK_BOT_TOKEN is no longer valid: reinstall the app and update the token",
        "token_revoked": "SLACK_BOT_TOKEN was revoked: reinstall the app and update the token",
        "token_expired": (
            "SLACK_BOT_TOKEN expired (token rotation is on): turn rotation off for the bot token "
            "or refresh it, then update the token"
        ),
        "account_inactive": (
            "the bot's token belongs to a deactivated app, user or workspace: reinstall the app "
            "and update SLACK_BOT_TOKEN"
        ),
        "missing_scope": "the app lacks a scope: reinstall it from slack-manifest.yml",
        "ratelimited": "Slack is rate-limiting the bot: fewer digests or a larger [slack] pace",
    }
    fix = fixes.get(error, "run `pitstop check-slack` to see what Slack refuses")
    return f'Slack refused "{what}" in {where}: {error} - {fix}'


def slack_gave_up(attempts: int) -> str:
    """Why a post was given up after its retries."""
    return f"gave up after {attempts} tries"


def slack_not_posted(where: str, error: str) -> str:
    """A team-visible post that Slack refused (logged, never shown in Slack)."""
    return f"Slack refused a post to {where}: {error}"


def slack_owner_note(channel: str) -> str:
    """The line above an alert DMed to an owner who is not in the channel it was posted in."""
    return f"You own this job and are not in <#{channel}>, where this was posted; acknowledging it there stops these messages."


def slack_home_no_role() -> str:
    """The App Home of someone who holds no role."""
    return "you hold no Pitstop role yet - ask an admin to add you to [auth] viewers"


def slack_home_updated(when: str) -> str:
    """The App Home tab's footer."""
    return f"updated {when} · type `/train help` for commands"


def too_many_websockets(max_wait: float) -> str:
    """Log line: Slack refused the Socket Mode connection, and what to do (``max_wait``: the longest
    backoff, in seconds)."""
    return (
        "Slack refused the Socket Mode connection (too_many_websockets): the app already has 10 open, Slack's "
        "limit - stop other `pitstop serve --socket` processes (or other apps sharing this app token); "
        f"trying again with a backoff of up to {max_wait:g} s"
    )


def slack_bot_ignored(bot: str, kind: str, channel: str) -> str:
    """Log line: an event from another bot (``bot``: its bot or app id) that runs nothing."""
    return (
        f"ignored a {kind} from bot {bot} in {channel or '?'}: bots run nothing"
        f" - list {bot} in [auth] bots to let it act as its bot user"
    )


# --- the console

CONSOLE_PROMPT = "pitstop> "  #: the console chat's input prompt
CONSOLE_CONFIRM = "confirm? [y/N] "  #: the console's question for a reply that asks for confirmation
CONSOLE_BYE = "bye"  #: the console's last line


def console_no_role(user: str) -> str:
    """The console's user is in no role of ``[auth]``: every request of theirs would be denied."""
    return (
        f"{user} is in no role of [auth]: add {user!r} to [auth] operators (or viewers, admins) in the config, "
        "or chat as a listed user with --as USER_ID (or PITSTOP_USER)"
    )


def console_awaiting(run_id: str, within: float) -> str:
    """Before ``bye``: a run this console started still awaits its verdict."""
    return f"waiting for the verdict of {run_id} (at most {within:g} s; Ctrl-C hands it over to the next pitstop)"


def console_button(label: str, action: str) -> str:
    """A button the console cannot click, shown as a hint."""
    return f"[{label}] ({action})"


# --- pitstop demo and its script


def cli_unmapped(os_user: str, source: str) -> str:
    """``[auth.cli]`` is set and does not map the OS user running Pitstop."""
    return (
        f"OS user {os_user!r} is not in [auth.cli] of {source or 'the config'}, so Pitstop does not know "
        f'who you are in Slack - add `{os_user} = "U0123ABCD"` (your member id) there'
    )


def cli_as_refused(os_user: str, mine: str, other: str) -> str:
    """``--as`` (or ``PITSTOP_USER``) from an OS user whose mapped id is not an admin."""
    return (
        f"--as {other} is refused: OS user {os_user!r} is {mine} in [auth.cli], and only an admin may act "
        "as someone else - run it without --as (or unset PITSTOP_USER)"
    )


def demo_bad_line(lineno: int, line: str, expected: str) -> str:
    """A demo script line that is not a command or a well-formed directive."""
    return f"demo script line {lineno}: {line!r} - expected {expected}"


def demo_wait_timed_out(kind: str, job: str, within: float) -> str:
    """A ``wait`` directive's event did not come in time."""
    return f"no {kind} for {job} within {within:g} s"


def demo_dirs(tmp: Path, charts: Path) -> str:
    """The demo's first line: its temp dir and where its charts are kept."""
    return f"demo dir {tmp} (deleted at the end unless --keep); digest charts kept in {charts}"


def demo_unexpected(lineno: int, what: str) -> str:
    """A demo step did not behave as expected (line 0: the demo's own start of the job)."""
    where = f"demo step at line {lineno}" if lineno else "the demo's initial start of the job"
    return f"{where} did not behave as expected: {what}"


def demo_done(steps: int, seconds: float) -> str:
    """The demo's last line when every step behaved."""
    return f"demo complete: {steps} steps behaved as expected in {seconds:.0f} s"


def demo_script_unreadable(path: str, reason: str) -> str:
    """The demo's ``--script`` file cannot be read."""
    return f"cannot read demo script {path}: {reason}"


# --- the CLI, serve and the scheduler


def config_summary(source: str, hosts: int, jobs: int, redis: str) -> str:
    """The one-line summary ``pitstop check-config`` prints for a valid file."""
    return f"{source}: ok - {hosts} host(s), {jobs} job(s), redis: {redis}"


def config_warning(problem: str) -> str:
    """A problem ``pitstop check-config`` reports without failing (``serve`` refuses it)."""
    return f"warning: {problem} (pitstop serve refuses to start until it is fixed)"


def missing_env(*names: str) -> str:
    """Required environment variables are unset (every one named)."""
    if len(names) == 1:
        return f"{names[0]} is not set - export it (secrets are read from the environment only)"
    return f"{', '.join(names[:-1])} and {names[-1]} are not set - export them (secrets are read from the environment only)"


def bad_env(name: str, rule: str) -> str:
    """An environment variable's value breaks ``rule`` (the value is not shown: it may be a secret)."""
    return f"{name} {rule}"


def embedded_redis_started(path: str) -> str:
    """Start-up notice when no ``[redis] url`` is configured."""
    return f"no [redis] url configured - using embedded Redis at {path}"


def state_store_was_away(start: float, end: float, timezone: str) -> str:
    """The announce post once Redis is back after an outage (``start``/``end``: unix s) longer than
    two watch intervals."""
    return (
        f"state store was unreachable from {fmt.clock(start, timezone)} to {fmt.clock(end, timezone)} "
        f"({fmt.duration(end - start)}); watching, verifications and alerts resume now"
    )


def serve_listening(url: str, admin: str | None) -> str:
    """``pitstop serve`` is up (HTTP mode; ``admin``: the admin listener's URL, if it listens)."""
    return f"serving Slack on {url} (POST /slack/events, GET /healthz){_admin_at(admin, '; ')}"


def _admin_at(url: str | None, lead: str) -> str:
    return f"{lead}serving GET /healthz, GET /healthz/details, GET /metrics on {url}" if url else ""


def listen_failed(host: str, port: int, exc: OSError, flags: str = "--host/--port") -> str:
    """``host:port`` cannot be listened on (the OS's reason: address already in use…), and the
    options (``flags``) that choose another."""
    reason = os.strerror(exc.errno) if exc.errno else str(exc)
    free = flags.split("/")[-1]
    return f"cannot listen on {host}:{port} ({reason}) - pass another {flags} ({free} 0: any free port)"


def socket_has_no_public_listener() -> str:
    """``serve --socket`` given ``--host``/``--port``, which only HTTP mode listens on."""
    return (
        "--host/--port are HTTP mode's public listener; Socket Mode has none - its /healthz and"
        " /metrics are on --admin-host/--admin-port"
    )


def admin_listen_failed(problem: str) -> str:
    """Log line: the admin listener could not start (``problem``: :func:`listen_failed`'s words)."""
    return f"{problem}; serving Slack without /healthz/details and /metrics"


def serve_socket_connected(admin: str | None) -> str:
    """``pitstop serve --socket`` is up (``admin``: the admin listener's URL, if it listens)."""
    return f"connected to Slack over Socket Mode{_admin_at(admin, '; ')}"


def heartbeat_slack_refused(error: str) -> str:
    """Heartbeat failure: Slack's ``auth.test`` is not ok (``error``: Slack's code)."""
    return f"Slack refuses Pitstop's token or cannot be reached (auth.test: {error}): alerts reach no one"


def heartbeat_untold(title: str, channel: str, error: str, at: float) -> str:
    """Heartbeat failure: an alert reached no one after the whole fallback chain (``at``: unix s)."""
    return f"an alert reached no one at {fmt.clock(at, date=True)}: {title!r} ({channel}: {error}, every fallback too)"


def heartbeat_watch_failed(host: str, error: str) -> str:
    """Heartbeat failure: a watch cycle of ``host``'s jobs failed in Pitstop itself."""
    return f"the watch cycle of {host} failed: {error}"


def heartbeat_no_answer(host: str, error: str) -> str:
    """Log line: the heartbeat service (only its ``host``: the URL is a secret) did not take a ping."""
    return f"heartbeat to {host} failed: {error}"


def scheduler_leader(instance: str, acquired: bool) -> str:
    """Log line: this process became, or stopped being, the scheduler leader."""
    return f"{instance} {'is now' if acquired else 'is no longer'} the scheduler leader"


def not_watching(start: float, end: float, found: dict[str, str], timezone: str) -> str:
    """The announce post of a leader back after a gap (``start``/``end``: unix s, as in the
    scheduler's ``_Gap``): when nobody watched, and what it found (``ok`` shows as RUNNING)."""
    jobs = ", ".join(f"{name} {'RUNNING' if c == 'ok' else c.upper()}" for name, c in found.items())
    return (
        f"Pitstop was not watching from {fmt.clock(start, timezone)} to {fmt.clock(end, timezone)} "
        f"({fmt.duration(end - start)}); on return: {jobs or 'nothing to watch'}"
    )


# --- trust-host


def host_key_prompt(host: str, where: str, key_type: str, fingerprint: str) -> str:
    """What ``pitstop trust-host`` shows of a host whose key is not pinned yet, as ``ssh`` does."""
    return (
        f"The authenticity of host '{host}' ({where}) can't be established.\n"
        f"{key_type} key fingerprint is {fingerprint}."
    )


def host_key_question(known_hosts: str) -> str:
    """``trust-host``'s question (without ``--yes``)."""
    return f"Trust it and add it to {known_hosts} (yes/no/[fingerprint])? "


HOST_KEY_ASK_AGAIN = "Please type 'yes', 'no' or the fingerprint: "
HOST_KEY_DECLINED = "not trusted - nothing was changed"


def host_key_added(host: str, known_hosts: str) -> str:
    """``trust-host`` pinned the key."""
    return f"Added host {host}'s key to {known_hosts}: Pitstop now connects to it."


def host_key_already(host: str, fingerprint: str, known_hosts: str) -> str:
    """``trust-host`` of a host whose key is already pinned."""
    return f"host {host}'s key {fingerprint} is already trusted in {known_hosts} - nothing to do"


# --- pitstop init: a commented config for one host and one job

#: the config ``pitstop init`` writes; ``{…}`` are TOML values (strings JSON-quoted) or whole lines
INIT_CONFIG = """\
# Pitstop configuration for job {job} on {address}, written by `pitstop init`.
# Every key, with its default, is described in pitstop.example.toml. Check it with `pitstop check-config`.
# Secrets never go here: SLACK_BOT_TOKEN and SLACK_SIGNING_SECRET (or SLACK_APP_TOKEN) come from the
# environment.

[slack]
# Channel id (C…) where restarts, alerts and digests are posted (right-click a channel → Copy link).
# `pitstop serve` refuses to start without one: a dead job's alert would reach no one.
{channel}

[auth]
# Immutable Slack user ids (U…) or user-group ids (S…), never display names; "*" is everyone.
# Roles nest: admin ⊇ operator ⊇ viewer. operator: restart, start, stop, cancel, watch, ack;
# viewer: status, logs, digest, history, follow, patches, lock, gpus, help.
{admins}
# operators = ["S0123456789"]
viewers = ["*"]

# Who `pitstop say` and `pitstop console` act as: the OS user running them (its uid; $USER is not
# believed) → their Slack user id, which needs a role above. An OS user not listed is refused.
{cli}

[state]
# Local state: the embedded Redis (unless [redis] url is set) and digest charts.
{state}
{redis}
[hosts.{host}]
# Address and port of the GPU host's sshd, and the SSH user (default: the local user).
address = {address_value}
port = {port}
{user}
# Pinned host keys: `pitstop trust-host {host}` shows the host's key fingerprint, as ssh does on first
# contact, and adds it here once confirmed.
known_hosts = {known_hosts}
# Private keys to log in with (default: ssh-agent and ~/.ssh/id_*); check-config refuses a missing one.
{client_keys}

[jobs.{job}]
host = {host_value}
# Where the job runs on the host (a git checkout, if named patches are to apply).
workdir = {workdir}
# The launch argv, run in workdir, fully detached (new session, output appended to log).
launch = {launch}
# The training log on the host; never truncated.
log = {log}
# Regular expression searched in each process's full command line: the job's processes.
match = {match}
# How many matching processes a running job has.
processes = {processes}
# Seconds a launch must stay up to count as started; seconds from SIGTERM to SIGKILL on stop.
start_window = 10
stop_timeout = 30
# Metric lines: JSON lines in the log, one per step, e.g.
#   {{"step": 120, "tokens_per_s": 900.0, "loss": 1.93}}
# A line with "step" and any of "tokens_per_s", "samples_per_s" or "loss" counts (optional: "rank",
# "role", "ts" in Unix seconds); digests, progress and the steps a restart lost come from them.
# Another format: metrics = {{ pattern = 'step (?P<step>\\d+) .* (?P<tokens_per_s>[0-9.]+) tok/s' }}
metrics = "jsonl"
"""
INIT_NO_CHANNEL = '# announce_channel = "C0123456789"'
INIT_NO_ADMIN = '# admins = ["U0123456789"]'
INIT_STATE_DEFAULT = '# dir = "~/.local/state/pitstop"'
INIT_NO_USER = '# user = "train"'


def init_cli_unmapped(os_user: str) -> str:
    """``[auth.cli]`` when ``pitstop init`` was given no admin id: the line to fill in."""
    return f'# [auth.cli]\n# {os_user} = "U0123456789"'


def init_no_client_key(path: str | None) -> str:
    """``client_keys`` left commented: none given, or the given file is not there (yet)."""
    if path is None:
        return '# client_keys = ["~/.ssh/id_ed25519"]'
    return f"# client_keys = [{path}]   # not found when this file was written: uncomment once it exists"


def init_exists(path: str) -> str:
    """``pitstop init`` would overwrite a file."""
    return f"{path} exists - pass --force to overwrite it, or --out FILE to write another"


def init_bad_launch(launch: str) -> str:
    """``--launch`` that is no command."""
    return (
        f'--launch {launch!r} is not a command - give the program and its arguments, e.g. "python3 train.py"'
    )


def init_written(path: str, host: str, where: str, job: str) -> str:
    """``pitstop init``'s first line: what it wrote, checked."""
    return f"wrote {path}: host {host} ({where}), job {job} - checked as check-config does"


def init_next_steps(host: str, job: str, config: str | None, serve_ready: bool) -> str:
    """The commands that come after ``pitstop init`` (``config``: the ``--config`` to add, if any)."""
    flag = f" --config {config}" if config else ""
    steps = [
        (f"pitstop trust-host {host}{flag}", "check the host's key fingerprint and pin it"),
        (f"pitstop check-config{' ' + config if config else ''}", "check the file again after each edit"),
        (f'pitstop say "start {job}" --wait{flag}', "start the job and wait for its verified verdict"),
        (f"pitstop serve{flag}", "serve Slack (export SLACK_BOT_TOKEN and SLACK_SIGNING_SECRET first)"),
    ]
    width = max(len(command) for command, _ in steps) + 3
    lines = [f"  {command.ljust(width)}{why}" for command, why in steps]
    if not serve_ready:
        lines.append(
            "  (set [slack] announce_channel first: serve refuses to start while alerts reach no one)"
        )
    return "next:\n" + "\n".join(lines)
