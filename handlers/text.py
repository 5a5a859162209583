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
#: ``history --attempts`` without a job
ATTEMPTS_NEED_JOB = "history --attempts needs a job: `history dflash --attempts`"
#: the labels of a confirmation's buttons
CONFIRM_BUTTON = "Confirm"
CANCEL_BUTTON = "Cancel"
#: a click on a confirmation that no longer exists
CONFIRM_GONE = "this confirmation has expired or was already answered - nothing was done"
#: ``digest`` with no jobs configured
DIGEST_NO_JOBS = "no jobs are configured - nothing to digest"
#: ``gpus HOST`` when no compute process holds GPU memory
GPUS_NO_PROCESSES = "no processes hold GPU memory"
#: ``status`` with no jobs configured
STATUS_NONE = "no jobs configured - add a [jobs.NAME] table to the config"
#: the headings of the refused and the two-person rule's parts of ``history``
HISTORY_REFUSALS_TITLE = "recent denied, refused and failed requests"
HISTORY_APPROVALS_TITLE = "two-person rule: requests, approvals, denials, expiries and break glass"
#: marks a run an admin started without approval
HISTORY_BREAK_GLASS = "break glass"
#: field labels of ``patches JOB`` (sha256: each patch file's first 12 hex digits now) and ``lock JOB``
FIELD_SHA256 = "sha256"
FIELD_AVAILABLE = "available"
FIELD_IN_EFFECT = "in effect"
FIELD_RUN = "run"
FIELD_SINCE = "since"
#: a finished run without a verdict (a stop that succeeded), a launched one whose verification is not due yet
RUN_DONE = "done"
RUN_AWAITING_VERDICT = "launched, awaiting verdict"
#: the columns of the ``status`` table, and of ``history``'s runs, approvals and refused-requests tables
STATUS_HEADERS = ("job", "state", "pid", "procs", "uptime", "last restart", "lock", "patches")
HISTORY_HEADERS = ("run", "when", "who", "action", "patches", "verdict", "took")
HISTORY_APPROVAL_HEADERS = ("when", "run", "who", "outcome", "what")
HISTORY_REFUSAL_HEADERS = ("when", "who", "request", "outcome", "why")
