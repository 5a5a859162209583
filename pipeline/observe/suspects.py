"""Evidence that points at one node of a job: an NVIDIA Xid, uncorrected ECC errors, a node Slurm
saw fail, the node of a stuck rank or of a degraded count.

Pure: each function reads text or names already fetched and says which node it points at and why
(``Xid 79``, ``NODE_FAIL``); the watcher (:mod:`handlers.watch.suspects`) fetches, decides and
keeps the suspicion (:class:`pipeline.state.nodes.Suspicion`).  ECC counts are read as the GPU
tables are (:mod:`pipeline.observe.gpus`: nvidia-smi's CSV, ``[N/A]`` is no reading).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence

from pipeline.observe.gpus import FORMAT, NVIDIA_SMI, csv_rows
from pipeline.observe.metrics import parse_number

ECC_FIELDS = ("index", "ecc.errors.uncorrected.volatile.total")
#: each GPU's uncorrected ECC errors since the driver loaded (``0, 2``; ``0, [N/A]`` without ECC)
QUERY_ECC_ARGV: tuple[str, ...] = (NVIDIA_SMI, "--query-gpu=" + ",".join(ECC_FIELDS), FORMAT)

#: ``NVRM: Xid (PCI:0000:18:00): 79, pid=1234, name=python, GPU has fallen off the bus.``
_XID = re.compile(r"\bXid\b(?:\s*\([^)]*\))?:?\s*(\d+)")
#: a degraded Slurm job's detail (:meth:`pipeline.engines.slurm.SlurmEngine.observe_many`):
#: ``n2 has 0/4 processes``
_SHORT_NODE = re.compile(r"(\S+) has \d+/\d+ processes")
#: Slurm node states of a node that failed (``DOWN*``, ``DOWN+NOT_RESPONDING``, ``FAIL``)
_FAILED_STATES = ("DOWN", "NOT_RESPONDING", "FAIL")


def xid(lines: Iterable[str]) -> str | None:
    """``Xid 79`` — the first NVIDIA Xid (with its number when the line gives one) in ``lines`` (a
    log, the kernel's ``dmesg`` lines), or None."""
    for line in lines:
        if m := _XID.search(line):
            return f"Xid {m.group(1)}"
    return None


def parse_ecc(text: str) -> dict[int, int]:
    """GPU index → its uncorrected volatile ECC errors, for the GPUs that have any, from
    :data:`QUERY_ECC_ARGV`'s output (``[N/A]``, ``[Not Supported]``: no reading, left out)."""
    out: dict[int, int] = {}
    for row in csv_rows(text, len(ECC_FIELDS)):
        count = parse_number(row[-1])
        if count:
            out[int(row[0])] = int(count)
    return out


def ecc_words(errors: Mapping[int, int]) -> str:
    """``uncorrected ECC errors on GPU 3 (2)``, ``… on GPUs 1 (1), 3 (2)``."""
    gpus = ", ".join(f"{i} ({n})" for i, n in sorted(errors.items()))
    return f"uncorrected ECC errors on GPU{'s' if len(errors) > 1 else ''} {gpus}"


def failed_nodes(nodelist: Sequence[str], states: Mapping[str, str]) -> list[str]:
    """The nodes of a job (``nodelist``) whose Slurm state (``states``: node → ``DOWN*``…) says
    they failed: down, not responding (``*``) or failing."""
    return [
        n for n in nodelist if (s := states.get(n, "")).endswith("*") or any(f in s for f in _FAILED_STATES)
    ]


def node_of_rank(rank: int, nodelist: Sequence[str], per_node: int) -> str | None:
    """The node global ``rank`` runs on, ranks laid out ``per_node`` to a node in ``nodelist``
    order (Slurm's default block distribution); None when it falls outside."""
    i = rank // max(1, per_node)
    return nodelist[i] if 0 <= i < len(nodelist) else None


def short_node(detail: str | None) -> str | None:
    """The one node a degraded job's ``detail`` names as short of processes, or None (none, or several)."""
    named = set(_SHORT_NODE.findall(detail or ""))
    return named.pop() if len(named) == 1 else None
