"""What Pitstop holds against the nodes of a Slurm cluster: the drains it made (who, why, when),
and the nodes evidence made suspect (why, until when).

One hash per cluster (:func:`pipeline.state.keys.node_notes`), node name → a :class:`NodeNote`;
``drain`` writes one, ``undrain`` removes it.  Beside it, one hash per cluster
(:func:`pipeline.state.keys.node_suspects`), node name → a :class:`Suspicion`: the watcher writes
one when an incident's evidence points at a node (an Xid, uncorrected ECC errors, ``NODE_FAIL``, a
stuck rank or a degraded count on one node); it expires by itself at its ``until``.  Clusters are
named by :func:`pipeline.engines.slurm.clusters`.
"""

from __future__ import annotations

from pydantic import BaseModel, ValidationError

from pipeline.state import keys
from pipeline.state.redisconn import Store


class NodeNote(BaseModel):
    """Why Pitstop holds a node: it drained it (``by`` a user id, ``reason`` as given, ``at`` unix s)."""

    kind: str = "drained"
    by: str
    reason: str
    at: float


class Suspicion(BaseModel):
    """Why a node is suspect: the evidence (``why``: ``Xid 79``, ``NODE_FAIL``…), the job whose
    incident brought it, when it was seen (``at``) and until when the node stays suspect (unix s)."""

    why: str
    job: str
    at: float
    until: float


class NodeNotes(Store):
    """The :class:`NodeNote` of each node, per cluster."""

    async def of(self, cluster: str) -> dict[str, NodeNote]:
        """Node name → its note on ``cluster`` (a note that no longer reads is left out)."""
        out: dict[str, NodeNote] = {}
        for node, raw in (await self.hash(keys.node_notes(self.prefix, cluster))).items():
            try:
                out[node] = NodeNote.model_validate_json(raw)
            except ValidationError:
                continue
        return out

    async def put(self, cluster: str, node: str, note: NodeNote) -> None:
        """Record ``note`` against ``node`` of ``cluster`` (replacing any)."""
        await self.client.hset(keys.node_notes(self.prefix, cluster), node, note.model_dump_json())

    async def suspect(self, cluster: str, node: str, suspicion: Suspicion) -> None:
        """Make ``node`` of ``cluster`` suspect (replacing an older suspicion: the newest evidence is kept)."""
        await self.client.hset(keys.node_suspects(self.prefix, cluster), node, suspicion.model_dump_json())

    async def suspects(self, cluster: str, now: float) -> dict[str, Suspicion]:
        """Node name → its suspicion on ``cluster`` still in force at ``now`` (unix s); expired (and
        unreadable) ones are forgotten."""
        key, out, gone = keys.node_suspects(self.prefix, cluster), {}, []
        for node, raw in (await self.hash(key)).items():
            try:
                found = Suspicion.model_validate_json(raw)
            except ValidationError:
                gone.append(node)
                continue
            if found.until > now:
                out[node] = found
            else:
                gone.append(node)
        if gone:
            await self.client.hdel(key, *gone)
        return out

    async def clear(self, cluster: str, node: str) -> bool:
        """Forget ``node``'s note on ``cluster``; True if there was one."""
        return bool(await self.client.hdel(keys.node_notes(self.prefix, cluster), node))
