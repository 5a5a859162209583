"""The ``pitstop`` command: ``demo | console | serve | say | parse | init | check-config | check-slack |
trust-host``.

Exit codes are :class:`pipeline.errors.ExitCode`'s (README); errors are one line on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any

from bot.console.init import DEFAULT_OUT, InitRequest, check_config, init_main
from bot.runtime import settings as settings_mod
from bot.runtime.settings import ADMIN_HOST, ADMIN_PORT, PUBLIC_HOST, PUBLIC_PORT
from bot.slack.blocks import plain
from bot.text import bad_env, config_summary, config_warning, missing_env, socket_has_no_public_listener
from pipeline.config import (
    HEARTBEAT_URL_RULE,
    Config,
    HealthSettings,
    alerts_nowhere,
    load_config,
    resolve_path,
)
from pipeline.errors import ExitCode, PitstopError, UsageError, internal_error, new_incident_id
from pipeline.state.redisconn import mask_url

log = logging.getLogger("pitstop")
#: ``--as``: who may use it is :mod:`bot.console.identity`'s rule
AS_HELP = "act as this Slack user id (with [auth.cli]: admins only; never for approve, deny, --break-glass)"


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--config", metavar="FILE", help="config file (default: $PITSTOP_CONFIG or ./pitstop.toml)"
    )
    common.add_argument("-v", "--verbose", action="store_true", help="log debug detail to stderr")

    p = argparse.ArgumentParser(
        prog="pitstop",
        description="Restart, watch and report on GPU training jobs from Slack.",
    )
    sub = p.add_subparsers(dest="verb", required=True, metavar="VERB")

    demo = sub.add_parser("demo", parents=[common], help="run the end-to-end demo on this machine")
    demo.add_argument("--script", metavar="FILE", help="run the lines of FILE non-interactively")
    demo.add_argument("--say", metavar="TEXT", action="append", default=[], help="run TEXT (repeatable)")
    demo.add_argument("--keep", action="store_true", help="keep the demo's temporary directory")

    console = sub.add_parser("console", parents=[common], help="chat with Pitstop in this terminal")
    console.add_argument("--as", dest="user", metavar="USER_ID", help=AS_HELP)

    serve = sub.add_parser("serve", parents=[common], help="serve Slack (HTTP, or Socket Mode with --socket)")
    serve.add_argument("--socket", action="store_true", help="use Socket Mode (needs SLACK_APP_TOKEN)")
    serve.add_argument(
        "--host",
        help=f"public listen address: /slack/events, bare /healthz (default {PUBLIC_HOST}; not with --socket)",
    )
    serve.add_argument(
        "--port", type=int, help=f"public listen port (default {PUBLIC_PORT}; not with --socket)"
    )
    serve.add_argument(
        "--admin-host",
        default=ADMIN_HOST,
        help=f"admin listen address: /healthz, /healthz/details, /metrics (default {ADMIN_HOST})",
    )
    serve.add_argument(
        "--admin-port", type=int, default=ADMIN_PORT, help=f"admin listen port (default {ADMIN_PORT})"
    )

    say = sub.add_parser("say", parents=[common], help="run one request as Slack would and print the reply")
    say.add_argument("text", metavar="TEXT")
    say.add_argument("--as", dest="user", metavar="USER_ID", help=AS_HELP)
    say.add_argument("--wait", action="store_true", help="also wait for and print the verdict line")
    say.add_argument("--json", dest="as_json", action="store_true", help="print the reply model as JSON")

    parse = sub.add_parser("parse", parents=[common], help="print the command TEXT parses to, as JSON")
    parse.add_argument("text", metavar="TEXT")

    init = sub.add_parser(
        "init",
        help="write a commented config for one host and one job, checked (then: trust-host, say, serve)",
    )
    init.add_argument(
        "--host", required=True, metavar="ADDRESS", help="the GPU host's address (gpu1.example.com)"
    )
    init.add_argument("--user", metavar="USER", help="SSH user on the host (default: the local user)")
    init.add_argument("--port", type=int, default=22, help="the host's sshd port (default 22)")
    init.add_argument(
        "--name", metavar="NAME", help="the host's name in the config (default: ADDRESS's first label)"
    )
    init.add_argument("--job", required=True, metavar="JOB", help="the job's name (tj)")
    init.add_argument(
        "--launch",
        required=True,
        metavar="COMMAND",
        help='its command line, run in WORKDIR ("python3 train.py")',
    )
    init.add_argument("--log", required=True, metavar="PATH", help="its training log on the host")
    init.add_argument(
        "--workdir", metavar="DIR", help="where it runs on the host (default: the log's directory)"
    )
    init.add_argument("--match", metavar="REGEX", help="its processes' command line (default: from --launch)")
    init.add_argument("--processes", type=int, default=1, metavar="N", help="how many processes it runs (1)")
    init.add_argument(
        "--channel", metavar="CHANNEL_ID", help="the Slack channel (C…) its posts and alerts go to"
    )
    init.add_argument(
        "--admin", metavar="USER_ID", help="your Slack user id (U…): an admin, and who this OS user acts as"
    )
    init.add_argument(
        "--key", metavar="FILE", help="the private key to log in with (default: ssh-agent, ~/.ssh/id_*)"
    )
    init.add_argument(
        "--known-hosts",
        default="~/.ssh/known_hosts",
        metavar="FILE",
        help="pinned host keys (~/.ssh/known_hosts)",
    )
    init.add_argument(
        "--state-dir", metavar="DIR", help="Pitstop's local state (default ~/.local/state/pitstop)"
    )
    init.add_argument(
        "--redis", metavar="URL", help="a Redis URL (default: an embedded Redis under the state dir)"
    )
    init.add_argument(
        "--out", default=str(DEFAULT_OUT), metavar="FILE", help=f"where to write ({DEFAULT_OUT})"
    )
    init.add_argument("--force", action="store_true", help="overwrite FILE if it exists")
    init.add_argument("-v", "--verbose", action="store_true", help="log debug detail to stderr")

    check = sub.add_parser("check-config", parents=[common], help="validate a config file")
    check.add_argument("file", nargs="?", metavar="FILE")

    doctor = sub.add_parser(
        "check-slack", parents=[common], help="check the token, scopes, channels and command against Slack"
    )
    doctor.add_argument(
        "--post", action="store_true", help="also post a test message to each channel and delete it"
    )

    trust = sub.add_parser(
        "trust-host", parents=[common], help="show a host's key fingerprint and add it to its known_hosts"
    )
    trust.add_argument("host", metavar="HOST", help="a host name of the config")
    trust.add_argument("--yes", action="store_true", help="trust the key without asking (for scripts)")
    return p


def run_async(
    make: Callable[[], Coroutine[Any, Any, int]], *, on_signal: ExitCode = ExitCode.CANCELLED
) -> int:
    """Run ``make()`` in a fresh event loop and return its exit code; SIGINT/SIGTERM cancel it so
    cleanup runs, and return ``on_signal`` (``serve`` uses 0: a normal stop)."""

    async def main() -> int:
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        stopped: list[int] = []

        def stop(signum: int) -> None:
            stopped.append(signum)
            task.cancel()

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop, sig)
        try:
            return await make()
        except asyncio.CancelledError:
            if stopped:
                return int(on_signal)
            raise
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)

    return asyncio.run(main())


def _dispatch(args: argparse.Namespace, env: settings_mod.Settings) -> int:
    verb: str = args.verb
    if verb == "init":
        return init_main(_init_request(args, env), Path(args.out), force=args.force)
    if verb == "check-config":
        path = resolve_path(args.file or args.config, env.config_path)
        config = check_config(path)
        redis = config.redis.url or f"embedded under {config.state.dir}"
        print(config_summary(str(path), len(config.hosts), len(config.jobs), mask_url(redis)))
        if unalerted := config.unalerted():  # `serve` refuses this config
            print(config_warning(alerts_nowhere(unalerted)), file=sys.stderr)
        return 0
    if verb == "demo":
        from bot.demo.run import demo_main  # lazy: each verb loads only its own stack (SSH, Redis, Slack)

        return run_async(lambda: demo_main(args, env))
    config = load_config(resolve_path(args.config, env.config_path))
    if verb == "parse":
        from bot.console.say import parse_main  # lazy: as above

        return parse_main(config, args.text)
    if verb in ("say", "console"):
        from bot.console.identity import cli_identity  # lazy: as above
        from bot.console.words import TerminalNames  # lazy: as above

        who = cli_identity(config, env.os_user, args.user or env.user)
        names = TerminalNames.from_settings(env)
    if verb == "say":
        from bot.console.say import say_main  # lazy: as above

        return run_async(
            lambda: say_main(config, args.text, who=who, wait=args.wait, as_json=args.as_json, names=names)
        )
    if verb == "console":
        from bot.console.chat import run_console  # lazy: as above

        return run_async(lambda: run_console(config, who=who, names=names))
    if verb == "serve":
        return _serve(args, env, config)
    if verb == "check-slack":
        from bot.slack.doctor import check_slack  # lazy: as above (slack_sdk, aiohttp)

        (token,) = _require(env, "bot_token")
        return run_async(lambda: check_slack(config, bot_token=token, api_url=env.api_url, post=args.post))
    if verb == "trust-host":
        return run_async(lambda: _trust_host(config, args.host, yes=args.yes))
    raise AssertionError(verb)  # argparse rejects unknown verbs


def _init_request(args: argparse.Namespace, env: settings_mod.Settings) -> InitRequest:
    """``pitstop init``'s flags as an :class:`InitRequest`, for the OS user running it."""
    return InitRequest(
        address=args.host,
        job=args.job,
        launch=args.launch,
        log=args.log,
        os_user=env.os_user,
        port=args.port,
        user=args.user,
        workdir=args.workdir,
        name=args.name,
        match=args.match,
        processes=args.processes,
        channel=args.channel,
        admin=args.admin,
        key=args.key,
        known_hosts=args.known_hosts,
        state_dir=args.state_dir,
        redis=args.redis,
    )


async def _trust_host(config: Config, host: str, *, yes: bool) -> int:
    """``trust-host``: show the host's key as ``ssh`` does on first contact; pin it once confirmed
    (``yes``: without asking).  Exit 0 when pinned or already trusted, 5 when declined."""
    from bot import text
    from pipeline.host.trust import HostKeys  # lazy: as above (asyncssh)

    keys = HostKeys(config)
    key = await keys.presented(host)
    shown = str(key.known_hosts)
    if key.state == "trusted":
        print(text.host_key_already(key.host, key.fingerprint, shown))
        return int(ExitCode.OK)
    if key.state == "unknown":
        print(text.host_key_prompt(key.host, key.where, key.key_type, key.fingerprint))
    answer = "yes" if yes or key.state == "changed" else _ask(text.host_key_question(shown), key.fingerprint)
    if answer != "yes":
        print(text.HOST_KEY_DECLINED)
        return int(ExitCode.CANCELLED)
    keys.trust(key)  # a changed key raises its warning: never pinned over the old one
    print(text.host_key_added(key.host, shown))
    return int(ExitCode.OK)


def _ask(question: str, fingerprint: str) -> str:
    """``yes`` or ``no``, as ``ssh`` asks: the fingerprint counts as yes, end of input as no."""
    from bot import text

    prompt = question
    while True:
        try:
            reply = input(prompt).strip()
        except EOFError:
            print()
            return "no"
        if reply in ("yes", "no"):
            return reply
        if reply == fingerprint:
            return "yes"
        prompt = text.HOST_KEY_ASK_AGAIN


def _require(env: settings_mod.Settings, *fields: str) -> list[str]:
    """The values of ``env``'s ``fields`` (``bot_token`` …), in order; :raises UsageError: naming the
    environment variable of every one unset, at once."""
    if missing := [settings_mod.ENVIRON[name] for name in fields if not getattr(env, name)]:
        raise UsageError(missing_env(*missing))
    return [getattr(env, name) for name in fields]


def _serve(args: argparse.Namespace, env: settings_mod.Settings, config: Config) -> int:
    from bot.runtime.serve import serve  # lazy: as above (slack_bolt, slack_sdk, aiohttp)

    if args.socket and (args.host is not None or args.port is not None):
        raise UsageError(socket_has_no_public_listener())
    if env.heartbeat_url:
        try:
            health = HealthSettings(heartbeat_url=env.heartbeat_url)
        except ValueError as exc:  # pydantic's ValidationError; the URL itself is a secret, never shown
            raise UsageError(bad_env("PITSTOP_HEARTBEAT_URL", HEARTBEAT_URL_RULE)) from exc
        config = config.model_copy(update={"health": health})
    mode = "app_token" if args.socket else "signing_secret"
    token, secret = _require(env, "bot_token", mode)

    async def serving() -> int:
        await serve(
            config,
            bot_token=token,
            api_url=env.api_url,
            admin_host=args.admin_host,
            admin_port=args.admin_port,
            host=args.host or PUBLIC_HOST,
            port=PUBLIC_PORT if args.port is None else args.port,
            **{mode: secret},
        )
        return 0

    return run_async(serving, on_signal=ExitCode.OK)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``pitstop`` console script; returns the exit code."""
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    env = settings_mod.from_environ()
    try:
        return _dispatch(args, env)
    except PitstopError as exc:
        print(plain(exc.message), file=sys.stderr)
        return int(exc.exit_code)
    except KeyboardInterrupt:
        return int(ExitCode.CANCELLED)
    except Exception:
        incident = new_incident_id()
        log.exception("incident %s", incident)
        print(internal_error(incident), file=sys.stderr)
        return int(ExitCode.FAILED)


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())
