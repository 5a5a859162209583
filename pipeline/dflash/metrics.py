"""Top-k accuracy of the drafter against the target's tokens, computed per chunk of positions."""

from __future__ import annotations

import torch


def _logits_topk(
    hidden: torch.Tensor, head_weight: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Vocabulary logits (n, vocab) of ``hidden`` (n, d) and their ``k`` largest values (n, k), descending."""
    logits = hidden @ head_weight.T
    values, _ = torch.topk(logits, k, dim=-1)
    return logits, values


@torch.no_grad()
def topk_accuracy(
    hidden: torch.Tensor, head_weight: torch.Tensor, labels: torch.Tensor, chunk: int
) -> dict[str, float]:
    """top-1/4/8 accuracy of the logits ``hidden @ head_weight.T`` against ``labels``.

    A position counts as correct at k iff fewer than k logits are strictly greater than the label's
    logit, so a tie at the k-th logit counts as inside the top-k and the value does not depend on how
    ``topk`` breaks ties (implemented as: label logit >= the k-th largest value).

    :param hidden: (n, d) drafter hidden states (after the final norm).
    :param head_weight: (vocab, d) the LM head weight; vocab >= 8.
    :param labels: (n,) int64 target token ids.
    :param chunk: positions per chunk; bounds the (chunk, vocab) logits held in memory.
    :returns: ``{"top1", "top4", "top8"}`` as fractions of the n positions, in [0, 1].
    """
    hits = {1: 0, 4: 0, 8: 0}
    n = hidden.shape[0]
    for start in range(0, n, chunk):
        h = hidden[start : start + chunk]
        y = labels[start : start + chunk, None]
        logits, values = _logits_topk(h, head_weight, 4)
        label_logit = logits.gather(1, y)
        hits[1] += int((label_logit >= values[:, 0:1]).sum())
        hits[4] += int((label_logit >= values[:, 3:4]).sum())
        logits, values = _logits_topk(h, head_weight, 8)
        label_logit = logits.gather(1, y)
        hits[8] += int((label_logit >= values[:, 7:8]).sum())
    return {f"top{k}": hits[k] / max(n, 1) for k in (1, 4, 8)}
