"""The frozen target LM and the DFlash-style block drafter.

Shapes use ``b`` sequences, ``T`` positions, ``N`` drafted blocks, ``B`` block size, ``C`` context
positions per block, ``d`` model width, ``F = len(feature_layers) * d_target`` fused feature width.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Attention(nn.Module):
    """Multi-head attention whose keys/values may include extra context positions (prepended)."""

    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} not divisible by n_heads={n_heads}")
        self.n_heads = n_heads
        self.q = nn.Linear(d_model, d_model, bias=False)
        self.kv = nn.Linear(d_model, 2 * d_model, bias=False)
        self.out = nn.Linear(d_model, d_model, bias=False)

    def forward(self, x: torch.Tensor, ctx: torch.Tensor | None = None, causal: bool = False) -> torch.Tensor:
        """``x`` (n, t, d) queries; ``ctx`` (n, c, d) extra key/value positions or None -> (n, t, d)."""
        n, t, d = x.shape
        src = x if ctx is None else torch.cat([ctx, x], dim=1)
        k, v = self.kv(src).chunk(2, dim=-1)

        def heads(z: torch.Tensor) -> torch.Tensor:
            return z.reshape(n, z.shape[1], self.n_heads, d // self.n_heads).transpose(1, 2)

        y = F.scaled_dot_product_attention(heads(self.q(x)), heads(k), heads(v), is_causal=causal)
        return self.out(y.transpose(1, 2).reshape(n, t, d))


class Block(nn.Module):
    """Pre-norm transformer block (attention + 4x GELU MLP)."""

    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = Attention(d_model, n_heads)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))

    def forward(self, x: torch.Tensor, ctx: torch.Tensor | None = None, causal: bool = False) -> torch.Tensor:
        """``x`` (n, t, d), ``ctx`` (n, c, d) or None -> (n, t, d)."""
        x = x + self.attn(self.ln1(x), ctx, causal)
        return x + self.mlp(self.ln2(x))


class TargetLM(nn.Module):
    """Small causal byte LM standing in for the frozen target model (tied embedding / LM head)."""

    def __init__(self, vocab_size: int, d_model: int, n_layers: int, n_heads: int, max_len: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, d_model)
        self.pos = nn.Embedding(max_len, d_model)
        self.blocks = nn.ModuleList(Block(d_model, n_heads) for _ in range(n_layers))
        self.norm = nn.LayerNorm(d_model)
        nn.init.normal_(self.embed.weight, std=0.02)
        nn.init.normal_(self.pos.weight, std=0.02)

    def forward(self, tokens: torch.Tensor, feature_layers: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """``tokens`` (b, T) int64 -> (logits (b, T, vocab), features (b, T, F)).

        ``features`` concatenates, along the last axis, the hidden states output by the blocks listed in
        ``feature_layers`` (shallow to deep).
        """
        x = self.embed(tokens) + self.pos(torch.arange(tokens.shape[1], device=tokens.device))
        hidden = []
        for block in self.blocks:
            x = block(x, causal=True)
            hidden.append(x)
        logits = self.norm(x) @ self.embed.weight.T
        return logits, torch.cat([hidden[i] for i in feature_layers], dim=-1)


class Drafter(nn.Module):
    """DFlash-style block drafter.

    The fused target features (concatenated layers -> linear projection -> norm) are prepended as
    key/value context to every drafter layer; the block (anchor token then mask tokens) attends to the
    context and bidirectionally to itself, so the whole block is predicted in one forward pass.
    """

    def __init__(
        self,
        vocab_size: int,
        d_model: int,
        n_layers: int,
        n_heads: int,
        feature_dim: int,
        block_size: int,
        ctx_len: int,
    ) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, d_model)
        self.block_pos = nn.Embedding(block_size, d_model)
        self.ctx_pos = nn.Embedding(ctx_len, d_model)
        self.fuse = nn.Linear(feature_dim, d_model)
        self.fuse_norm = nn.LayerNorm(d_model)
        self.layers = nn.ModuleList(Block(d_model, n_heads) for _ in range(n_layers))
        self.norm = nn.LayerNorm(d_model)
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False)

    def forward(
        self, block_tokens: torch.Tensor, features: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``block_tokens`` (N, B) int64, ``features`` (N, C, F) -> (hidden (N, B, d), logits (N, B, vocab))."""
        b_len, c_len = block_tokens.shape[1], features.shape[1]
        dev = block_tokens.device
        ctx = self.fuse_norm(self.fuse(features)) + self.ctx_pos(torch.arange(c_len, device=dev))
        x = self.embed(block_tokens) + self.block_pos(torch.arange(b_len, device=dev))
        for layer in self.layers:
            x = layer(x, ctx)
        hidden = self.norm(x)
        return hidden, self.lm_head(hidden)
