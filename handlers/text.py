"""The constant words of the replies ``handlers/`` builds: labels, titles and notes without arguments.

Words computed from values (a job, a count, a duration) stay functions beside the reply that
shows them; only fixed strings live here, so a surface or a test can name them.
"""

from __future__ import annotations

from types import MappingProxyType

#: an alert whose log tail could not be read
ALERT_NO_LOG = "the log could not be read"
#: an alert's "last seen alive" when the watcher never saw the job alive
ALERT_NEVER_SEEN = "not seen by the watcher"
#: labels of an alert's fields, by field id
ALERT_FIELD_LABELS = MappingProxyType(
    {
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
)
#: the label of a failed run's show-log button
SHOW_LOG_BUTTON = "Show log"
#: the caption of the Python stacks under hang evidence
HANG_STACKS_TITLE = "Python stacks (py-spy dump)"
#: the labels of an approval request's buttons (the two-person rule)
APPROVE_BUTTON = "Approve"
DENY_BUTTON = "Deny"
