"""The metric log window a digest reads: bounded reads from a byte offset, complete lines only.

The last scheduled digest's offset is kept (:class:`OffsetState`) with the file's inode, size and
the bytes before it: a file now shorter was truncated, another inode or other bytes rotated —
either way the window starts again at 0.  Only the **last** ``max_bytes``, from a line start, are
read; an on-demand digest with nothing new reads the last scheduled window again.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import asdict, dataclass, replace
from enum import StrEnum

from pipeline.config import JobConfig
from pipeline.host.probe import read_log_chunk
from pipeline.host.remote import RemoteHosts

MAX_WINDOW_BYTES = 8 * 1024 * 1024  #: most bytes of metric log read per digest
FIRST_WINDOW_BYTES = 1024 * 1024
"""Most bytes a first digest (no stored offset) reads: its last 1 MiB, about 4,600 lines of the
reference pipeline (575 steps of its 8 ranks, some 20 minutes) — enough for its step-time p95 and
each rank's rate, an eighth of what later digests may read."""
FINGERPRINT_BYTES = 64  #: bytes before the stored offset kept to recognise the same file


@dataclass(frozen=True)
class LogRead:
    """What one bounded read of the metric log returned."""

    data: bytes
    offset: int  #: the file offset of ``data[0]`` (0 when the reader restarted a truncated file)
    size: int  #: the file's size when it was read, bytes
    inode: int | None = None


LogReader = Callable[[int, int], Awaitable[LogRead]]
"""``await reader(offset, max_bytes)``: at most ``max_bytes`` of the log from ``offset``; a
negative ``offset`` counts from the end of the file (``-N``: its last ``N`` bytes)."""


class WindowKind(StrEnum):
    """How a digest's window was chosen."""

    SINCE_LAST = "since_last"  #: everything written since the scheduled offset
    LAST_BYTES = "last_bytes"  #: no offset yet: the last ``max_bytes`` (or the whole smaller file)
    REPEAT = "repeat"  #: on demand, nothing new: the last scheduled digest's window again
    TRUNCATED = "truncated"  #: the file shrank below the offset: read from its start
    ROTATED = "rotated"  #: another file (inode or bytes before the offset differ): from its start


@dataclass(frozen=True)
class OffsetState:
    """What a scheduled digest remembers in ``keys.digest_offset`` about the log."""

    offset: int  #: byte offset after the last complete line read
    start: int  #: where that digest's window began (re-read on demand when nothing is new)
    size: int
    inode: int | None
    fingerprint: bytes  #: the bytes just before ``offset`` (up to :data:`FINGERPRINT_BYTES`)
    at: float  #: when it was stored (unix s)

    def to_hash(self) -> dict[str, str]:
        """The Redis hash fields (``inode`` empty when unknown, ``fingerprint`` in hex)."""
        hexed = {"fingerprint": self.fingerprint.hex()}
        return {k: "" if v is None else str(v) for k, v in (asdict(self) | hexed).items()}

    @classmethod
    def from_hash(cls, raw: Mapping[str, str]) -> OffsetState | None:
        """Parse the Redis hash (``keys.digest_offset``); None when absent (empty) or unreadable
        (the digest starts afresh)."""
        try:
            start, size = (int(raw.get(key) or 0) for key in ("start", "size"))
            inode = int(raw["inode"]) if raw.get("inode") else None
            fingerprint = bytes.fromhex(raw.get("fingerprint") or "")
            return cls(int(raw["offset"]), start, size, inode, fingerprint, float(raw.get("at") or 0.0))
        except (KeyError, ValueError):
            return None


@dataclass(frozen=True)
class LogWindow:
    """The bytes a digest aggregates: complete lines only (``data`` ends with a newline or is empty)."""

    data: bytes
    start: int  #: file offset of ``data[0]``
    end: int  #: file offset after the last complete line (the next scheduled offset)
    size: int
    inode: int | None
    kind: WindowKind
    skipped: int = 0  #: bytes written since the offset that were not read (over ``max_bytes``)
    fingerprint: bytes = b""  #: the last bytes before ``end``

    def state(self, at: float) -> OffsetState:
        """The offset state a scheduled digest stores after reading this window."""
        return OffsetState(self.end, self.start, self.size, self.inode, self.fingerprint, at)


async def _read_from(reader: LogReader, start: int, size: int, max_bytes: int, kind: WindowKind) -> LogWindow:
    """Read ``[max(start, size - max_bytes), size)`` aligned to a line start; keep complete lines."""
    begin = max(start, size - max_bytes)
    skipped = begin - start
    if begin > 0 and begin > start:
        # read one byte before: if it is a newline, ``begin`` already starts a line
        got = await reader(begin - 1, size - begin + 1)
        data, first = _after_first_newline(got)
    else:
        got = await reader(begin, size - begin)
        data, first = got.data, got.offset
    return _complete(data, first, got, kind, skipped)


def _after_first_newline(got: LogRead) -> tuple[bytes, int]:
    """``got``'s bytes after its first newline and their offset (its first byte precedes the window)."""
    nl = got.data.find(b"\n")
    return (got.data[nl + 1 :], got.offset + nl + 1) if nl >= 0 else (b"", got.offset + len(got.data))


def _complete(data: bytes, first: int, got: LogRead, kind: WindowKind, skipped: int) -> LogWindow:
    whole = data[: data.rfind(b"\n") + 1]
    end = first + len(whole)
    return LogWindow(whole, first, end, got.size, got.inode, kind, skipped, whole[-FINGERPRINT_BYTES:])


async def read_window(
    reader: LogReader, state: OffsetState | None, *, scheduled: bool, max_bytes: int = MAX_WINDOW_BYTES
) -> LogWindow:
    """The bytes a digest aggregates (module docstring), read with at most two bounded reads;
    ``state`` is what the last scheduled digest stored, and a scheduled caller stores
    ``window.state(now)``."""
    if state is None:  # the last max_bytes and the byte before them, in one read
        got = await reader(-(max_bytes + 1), max_bytes + 1)
        if got.offset == 0 and len(got.data) <= max_bytes:
            return _complete(got.data, 0, got, WindowKind.LAST_BYTES, 0)
        data, first = _after_first_newline(got)
        return _complete(data, first, got, WindowKind.LAST_BYTES, got.offset + 1)
    fp = state.fingerprint[len(state.fingerprint) - min(len(state.fingerprint), state.offset) :]
    ask = state.offset - len(fp)
    got = await reader(ask, len(fp) + max_bytes)
    if got.size < state.offset:
        return await _read_from(reader, 0, got.size, max_bytes, WindowKind.TRUNCATED)
    other_inode = state.inode is not None and got.inode is not None and got.inode != state.inode
    if other_inode or got.offset != ask or got.data[: len(fp)] != fp:
        return await _read_from(reader, 0, got.size, max_bytes, WindowKind.ROTATED)
    if got.size - state.offset > max_bytes:
        return await _read_from(reader, state.offset, got.size, max_bytes, WindowKind.SINCE_LAST)
    window = _complete(got.data[len(fp) :], state.offset, got, WindowKind.SINCE_LAST, 0)
    if window.data:
        return window
    if not scheduled and state.start < state.offset:
        again = await _read_from(reader, state.start, state.offset, max_bytes, WindowKind.REPEAT)
        return replace(again, size=got.size, inode=got.inode, fingerprint=b"")
    # nothing complete since the offset: stay there, keeping the fingerprint of the bytes before it
    return LogWindow(b"", state.offset, state.offset, got.size, got.inode, WindowKind.SINCE_LAST, 0, fp)


def remote_reader(ssh: RemoteHosts, job_name: str, job: JobConfig) -> LogReader:
    """A :data:`LogReader` over the job's metric log on its host, one helper call per read.

    :raises RemoteCommandError, HostUnreachable: (from the returned reader).
    """

    async def reader(offset: int, max_bytes: int) -> LogRead:
        chunk = await read_log_chunk(ssh, job_name, job, offset, max_bytes, path=job.metrics_path)
        return LogRead(chunk.data, chunk.offset - len(chunk.data), chunk.size, chunk.inode)

    return reader
