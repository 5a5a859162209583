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
from pipeline.pager.pagerduty import AckReader, PagerDuty

#: where PagerDuty's routing key comes from (read by bot/runtime/settings.py)
ROUTING_KEY_ENV = "PAGERDUTY_ROUTING_KEY"
API_TOKEN_ENV = "PAGERDUTY_API_TOKEN"  #: where PagerDuty's REST API key comes from (``sync_acks``)


def open_pager(
    settings: PagerSettings,
    routing_key: str | None,
    on_trouble: Callable[[str], Awaitable[None]] | None = None,
    *,
    api_token: str | None = None,
) -> Pager:
    """The configured pager, sending in the background.

    :param routing_key: PagerDuty's integration key (``PAGERDUTY_ROUTING_KEY``), unused by Alertmanager.
    :param on_trouble: called with a line when the pager keeps refusing (a refusal not retried, or
        retries spent), once until it accepts again.
    :param api_token: PagerDuty's REST API key (``PAGERDUTY_API_TOKEN``), for ``sync_acks``.
    :raises ConfigError: if PagerDuty is configured and ``routing_key`` is unset, or ``sync_acks``
        and ``api_token`` is.
    """
    kind: PagerKind
    if settings.kind == "pagerduty":
        if not routing_key:
            raise ConfigError([f'pager: kind = "pagerduty" needs {ROUTING_KEY_ENV} in the environment'])
        if settings.sync_acks and not api_token:
            raise ConfigError([f"pager.sync_acks: needs {API_TOKEN_ENV} in the environment"])
        reads = AckReader(settings.api_url, api_token) if settings.sync_acks and api_token else None
        kind = PagerDuty(settings.endpoint, routing_key, reads)
    else:
        kind = Alertmanager(settings.endpoint)
    return Pager(kind, on_trouble=on_trouble, sync_every=settings.sync_every)
