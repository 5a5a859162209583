"""``bot`` — the surfaces and the assembly: the top layer, imported by nothing of Pitstop's.

- Slack: the Bolt app over HTTP and Socket Mode :mod:`~bot.slack_app` (ack first,
  :mod:`~bot.ackgate`), served by :mod:`~bot.serve`; Block Kit rendering within Slack's limits
  :mod:`~bot.blocks`; one Web API call :mod:`~bot.slack_api`; one message at most once, at
  Slack's pace :mod:`~bot.slack_send`; the team-visible posts :mod:`~bot.slack_outbox`; people's
  names :mod:`~bot.people`; ``check-slack`` :mod:`~bot.slack_doctor`; ``/metrics``
  :mod:`~bot.metrics`;
- the console chat :mod:`~bot.console` and ``pitstop say``/``parse`` :mod:`~bot.say`, over the
  same handlers as Slack;
- the assembly :mod:`~bot.assembly` (Redis, SSH pool, context), the scheduler
  :mod:`~bot.scheduler` (APScheduler: verifications, watch cycles, digests), the environment
  :mod:`~bot.settings`, the CLI :mod:`~bot.cli`, and the demo :mod:`~bot.demo` with its script
  language :mod:`~bot.demo_script`.

Surface text (Slack markers, console prompts, the demo's lines) lives beside the surface that
shows it.
"""
