"""Pagers: an incident sent to the paging tool a team already runs (``[pager]``).

One seam (:class:`~pipeline.pager.base.PagerKind`: how one kind speaks its API) and one module per
kind (:mod:`~pipeline.pager.pagerduty`, :mod:`~pipeline.pager.alertmanager`); the sending — in the
background, retried with backoff, a refusing pager reported — is written once
(:class:`~pipeline.pager.base.Pager`).  :func:`open_pager` builds the configured one.

May import :mod:`pipeline.config`, :mod:`pipeline.errors` and :mod:`pipeline.fmt`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from pipeline.config import PagerSettings
from pipeline.errors import ConfigError
from pipeline.pager.alertmanager import Alertmanager
from pipeline.pager.base import Pager as Pager
from pipeline.pager.base import PagerAlert as PagerAlert
from pipeline.pager.base import PagerKind
from pipeline.pager.pagerduty import PagerDuty

ROUTING_KEY_ENV = (
    "PAGERDUTY_ROUTING_KEY"  #: where PagerDuty's routing key comes from (bot/runtime/settings.py)
)


def open_pager(
    settings: PagerSettings,
    routing_key: str | None,
    on_trouble: Callable[[str], Awaitable[None]] | None = None,
) -> Pager:
    """The configured pager, sending in the background.

    :param routing_key: PagerDuty's integration key (``PAGERDUTY_ROUTING_KEY``), unused by Alertmanager.
    :param on_trouble: called with a line when the pager keeps refusing (a refusal not retried, or
        retries spent), once until it accepts again.
    :raises ConfigError: if PagerDuty is configured and ``routing_key`` is unset.
    """
    kind: PagerKind
    if settings.kind == "pagerduty":
        if not routing_key:
            raise ConfigError([f'pager: kind = "pagerduty" needs {ROUTING_KEY_ENV} in the environment'])
        kind = PagerDuty(settings.endpoint, routing_key)
    else:
        kind = Alertmanager(settings.endpoint)
    return Pager(kind, on_trouble=on_trouble)
