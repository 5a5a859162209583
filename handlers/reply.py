"""The transport-free reply model every handler returns, and its plain-text renderer.

Surfaces render a :class:`Reply` and nothing else (``bot/slack/blocks.py`` into Block Kit,
``bot/console/chat.py`` with rich, :func:`render_text` for ``pitstop say`` and logs).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from enum import StrEnum

from pipeline.errors import ExitCode


class Status(StrEnum):
    """The tone of a reply: how a surface colours or marks it."""

    OK = "ok"
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"


@dataclass(frozen=True)
class StepLine:
    """One step of a run as shown live: label, mark, seconds taken, detail."""

    label: str
    outcome: str  #: :class:`pipeline.verdict.Outcome` value
    seconds: float | None = None
    detail: str = ""

    @property
    def mark(self) -> str:
        """``✓`` ok, ``✗`` failed, ``…`` running/waiting, ``-`` skipped."""
        return {"ok": "✓", "failed": "✗", "skipped": "-"}.get(self.outcome, "…")

    def text(self) -> str:
        """``✓ stop 2.1 s - 8 processes stopped``; a step not yet due reads ``… verify: waiting``."""
        took = f" {self.seconds:.1f} s" if self.seconds is not None else ""
        detail = f" - {self.detail}" if self.detail else ""
        if self.outcome == "waiting":
            return f"{self.mark} {self.label}: waiting{detail}"
        return f"{self.mark} {self.label}{took}{detail}"


@dataclass(frozen=True)
class Table:
    """A small table: column headers and rows of cells (strings)."""

    headers: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]


@dataclass(frozen=True)
class Button:
    """An interactive choice: ``action`` is the id a surface routes back (``confirm``, ``cancel``, ``show_log``)."""

    label: str
    action: str
    value: str
    style: str | None = None  #: "primary" | "danger" | None


@dataclass(frozen=True)
class Attachment:
    """A file that goes with a reply (a patch under review): shown as a file snippet where the
    surface can, as its path elsewhere."""

    filename: str  #: as shown (``topk.diff``)
    content: str  #: exactly as it is sent on (a patch: what ``git apply`` is given)
    title: str = ""  #: a caption (``topk.diff · sha256 1a2b3c4d5e6f``)
    path: str = ""  #: where it lies on this machine, or empty


@dataclass(frozen=True)
class Reply:
    """What a handler answers, for any surface."""

    title: str  #: one line, the headline (``restart of dflash: RUNNING 8/8 processes pid 4242``)
    status: Status = Status.INFO
    lines: tuple[str, ...] = ()  #: body text lines (already worded by the handler)
    fields: tuple[tuple[str, str], ...] = ()  #: label → value pairs shown side by side
    tables: tuple[Table, ...] = ()
    steps: tuple[StepLine, ...] = ()  #: a run's live step list
    log: str | None = None  #: a log excerpt (preformatted; surfaces truncate visibly)
    log_title: str = ""  #: what the excerpt is (``last 30 lines of /w/train.log``)
    ephemeral: bool = False  #: only the requester should see it (input errors, denials)
    thread_key: str | None = None  #: groups posts into one thread (``run:r-42``, ``incident:dflash:3``)
    run_id: str | None = None
    chart: str | None = None  #: path of a PNG to upload with the reply (digests)
    buttons: tuple[Button, ...] = ()
    attachments: tuple[Attachment, ...] = ()  #: files posted with it (a patch's whole diff)
    follow_ups: tuple[Reply, ...] = ()  #: replies that belong in the thread under this one
    exit_code: ExitCode = ExitCode.OK  #: what the CLI exits with
    #: who this reply pages (``[slack] alert_mention``: ``here``, ``channel``, ``S…``, ``U…``): the
    #: one reference in its text a surface lets notify; every other one is shown as a name
    page: str | None = None
    #: whom else it pages: the job's owners (``U…``, ``S…``), kept live like ``page``; a surface
    #: also tells each owning user who cannot see the post
    owners: tuple[str, ...] = ()
    redelivery: bool = False  #: the answer to a second delivery of a request already acted on

    def to_dict(self) -> dict[str, object]:
        """A JSON-ready dict (``pitstop say --json``)."""
        return {
            **asdict(self),
            "fields": dict(self.fields),
            "buttons": [{"label": b.label, "action": b.action, "value": b.value} for b in self.buttons],
            "attachments": [
                {"filename": a.filename, "title": a.title, "path": a.path} for a in self.attachments
            ],
            "follow_ups": [f.to_dict() for f in self.follow_ups],
        }


def refused(title: str, exit_code: ExitCode = ExitCode.USAGE, status: Status = Status.ERROR) -> Reply:
    """An answer only the asker sees (an input error, a denial, a cancellation): ``title`` in the
    ``status`` tone, and the CLI's ``exit_code``."""
    return Reply(title=title, status=status, ephemeral=True, exit_code=exit_code)


def format_table(table: Table) -> list[str]:
    """A table as aligned monospace lines (header, rule, rows)."""
    widths = [len(h) for h in table.headers]
    for row in table.rows:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=False)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    out = [fmt.format(*table.headers).rstrip(), "  ".join("-" * w for w in widths)]
    out += [fmt.format(*row).rstrip() for row in table.rows]
    return out


def render_text(reply: Reply) -> str:
    """The reply as plain text, the way ``pitstop say`` prints it."""
    out = [reply.title]
    out += [s.text() for s in reply.steps]
    out += list(reply.lines)
    out += [f"{k}: {v}" for k, v in reply.fields]
    for table in reply.tables:
        out += format_table(table)
    if reply.log:
        if reply.log_title:
            out.append(reply.log_title + ":")
        out += ["    " + line for line in reply.log.rstrip("\n").splitlines()]
    if reply.chart:
        out.append(f"chart: {reply.chart}")
    out += [
        f"attached: {a.title or a.filename}" + (f" ({a.path})" if a.path else "") for a in reply.attachments
    ]
    for follow in reply.follow_ups:
        out += ["", render_text(follow)]
    return "\n".join(out)
