"""The ``pitstop`` command: ``demo | console | serve | say | parse | check-config | check-slack``.

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
from typing import Any

from bot.runtime import settings as settings_mod
from bot.text import config_summary, missing_env
from pipeline.config import Config, load_config, resolve_path
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
        default="0.0.0.0",
        help="HTTP listen address (default 0.0.0.0; with --socket: /healthz, /metrics)",
    )
    serve.add_argument("--port", type=int, default=3000, help="HTTP listen port (default 3000)")

    say = sub.add_parser("say", parents=[common], help="run one request as Slack would and print the reply")
    say.add_argument("text", metavar="TEXT")
    say.add_argument("--as", dest="user", metavar="USER_ID", help=AS_HELP)
    say.add_argument("--wait", action="store_true", help="also wait for and print the verdict line")
    say.add_argument("--json", dest="as_json", action="store_true", help="print the reply model as JSON")

    parse = sub.add_parser("parse", parents=[common], help="print the command TEXT parses to, as JSON")
    parse.add_argument("text", metavar="TEXT")

    check = sub.add_parser("check-config", parents=[common], help="validate a config file")
    check.add_argument("file", nargs="?", metavar="FILE")

    doctor = sub.add_parser(
        "check-slack", parents=[common], help="check the token, scopes, channels and command against Slack"
    )
    doctor.add_argument(
        "--post", action="store_true", help="also post a test message to each channel and delete it"
    )
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
    if verb == "check-config":
        path = resolve_path(args.file or args.config, env.config_path)
        config = load_config(path)
        from pipeline.engines import ENGINES  # lazy: as below (the engines load SSH)
        from pipeline.engines.base import check_engines

        check_engines(config, ENGINES)
        redis = config.redis.url or f"embedded under {config.state.dir}"
        print(config_summary(str(path), len(config.hosts), len(config.jobs), mask_url(redis)))
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

        who = cli_identity(config, env.os_user, args.user or env.user)
    if verb == "say":
        from bot.console.say import say_main  # lazy: as above

        return run_async(lambda: say_main(config, args.text, who=who, wait=args.wait, as_json=args.as_json))
    if verb == "console":
        from bot.console.chat import run_console  # lazy: as above

        return run_async(lambda: run_console(config, who=who))
    if verb == "serve":
        return _serve(args, env, config)
    if verb == "check-slack":
        from bot.slack.doctor import check_slack  # lazy: as above (slack_sdk, aiohttp)

        (token,) = _require(env, "bot_token")
        return run_async(lambda: check_slack(config, bot_token=token, api_url=env.api_url, post=args.post))
    raise AssertionError(verb)  # argparse rejects unknown verbs


def _require(env: settings_mod.Settings, *fields: str) -> list[str]:
    """The values of ``env``'s ``fields`` (``bot_token`` …), in order; :raises UsageError: naming the
    environment variable of the first one unset."""
    for name in fields:
        if not getattr(env, name):
            raise UsageError(missing_env(settings_mod.ENVIRON[name]))
    return [getattr(env, name) for name in fields]


def _serve(args: argparse.Namespace, env: settings_mod.Settings, config: Config) -> int:
    from bot.runtime.serve import serve  # lazy: as above (slack_bolt, slack_sdk, aiohttp)

    mode = "app_token" if args.socket else "signing_secret"
    token, secret = _require(env, "bot_token", mode)

    async def serving() -> int:
        await serve(
            config, bot_token=token, api_url=env.api_url, host=args.host, port=args.port, **{mode: secret}
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
        print(exc.message, file=sys.stderr)
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
