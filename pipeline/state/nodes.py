"""What Pitstop holds against the nodes of a Slurm cluster: the drains it made (who, why, when).

One hash per cluster (:func:`pipeline.state.keys.node_notes`), node name → a :class:`NodeNote`;
``drain`` writes one, ``undrain`` removes it.  Clusters are named by
:func:`pipeline.engines.slurm.clusters`.
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

    async def clear(self, cluster: str, node: str) -> bool:
        """Forget ``node``'s note on ``cluster``; True if there was one."""
        return bool(await self.client.hdel(keys.node_notes(self.prefix, cluster), node))
