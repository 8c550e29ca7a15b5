"""The reference trainer's model: a decoder-only GPT built from a recipe's ``model`` section.

Token + learned position embedding, pre-LayerNorm blocks (causal SDPA attention with grouped-query
key/value heads, GELU MLP), a final LayerNorm and an output head (tied to the token embedding if asked).
Initial weights depend only on the seed passed to :func:`build_model`, never on the parallel layout.
"""

from __future__ import annotations

import logging
import math
from typing import Literal, cast

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from attune.recipe.model import ModelSpec

log = logging.getLogger(__name__)

Checkpointing = Literal["none", "selective", "full"]


class Attention(nn.Module):
    """Causal self-attention with ``kv_groups`` key/value heads shared by groups of query heads (GQA)."""

    def __init__(self, hidden: int, heads: int, kv_groups: int, dropout: float) -> None:
        super().__init__()
        self.heads, self.kv_groups, self.head_dim = heads, kv_groups, hidden // heads
        self.dropout = dropout
        self.qkv = nn.Linear(hidden, (heads + 2 * kv_groups) * self.head_dim)
        self.proj = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        hd = self.head_dim
        q, k, v = self.qkv(x).split([self.heads * hd, self.kv_groups * hd, self.kv_groups * hd], dim=-1)
        q = q.view(b, t, self.heads, hd).transpose(1, 2)
        k = k.view(b, t, self.kv_groups, hd).transpose(1, 2)
        v = v.view(b, t, self.kv_groups, hd).transpose(1, 2)
        y = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0,
            enable_gqa=self.kv_groups != self.heads,
        )
        return cast(torch.Tensor, self.proj(y.transpose(1, 2).reshape(b, t, c)))


class MLP(nn.Module):
    """Pre-LN feed-forward sub-layer: LayerNorm → Linear → GELU → Linear → dropout (residual added by the block)."""

    def __init__(self, hidden: int, ffn_hidden: int, dropout: float) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(hidden)
        self.fc = nn.Linear(hidden, ffn_hidden)
        self.out = nn.Linear(ffn_hidden, hidden)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cast(torch.Tensor, self.drop(self.out(F.gelu(self.fc(self.ln(x))))))


class Block(nn.Module):
    """One pre-LN transformer block; ``checkpointing='selective'`` recomputes only its MLP in backward."""

    def __init__(self, spec: ModelSpec, dropout: float, checkpointing: Checkpointing) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(spec.hidden_size)
        self.attn = Attention(spec.hidden_size, spec.heads, spec.num_kv_groups, dropout)
        self.drop = nn.Dropout(dropout)
        self.mlp = MLP(spec.hidden_size, spec.ffn_hidden_size, dropout)
        self.selective = checkpointing == "selective"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop(self.attn(self.ln(x)))
        if self.selective and torch.is_grad_enabled():
            return x + cast(torch.Tensor, checkpoint(self.mlp, x, use_reentrant=False))
        return x + cast(torch.Tensor, self.mlp(x))


class GPT(nn.Module):
    """Decoder-only GPT; ``forward(idx, targets)`` returns the mean next-token cross-entropy (fp32)."""

    def __init__(self, spec: ModelSpec, max_seq_length: int, dropout: float = 0.0,
                 checkpointing: Checkpointing = "none") -> None:
        super().__init__()
        if spec.is_moe:
            raise ValueError("the reference trainer has no MoE layers; remove model.moe_experts/moe_top_k")
        self.spec, self.full_checkpointing = spec, checkpointing == "full"
        self.tok = nn.Embedding(spec.vocab_size, spec.hidden_size)
        self.pos = nn.Embedding(max_seq_length, spec.hidden_size)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(spec, dropout, checkpointing) for _ in range(spec.layers))
        self.ln_f = nn.LayerNorm(spec.hidden_size)
        self.head = nn.Linear(spec.hidden_size, spec.vocab_size, bias=False)
        if spec.tied_embeddings:
            self.head.weight = self.tok.weight
        self._init_weights()

    def _init_weights(self) -> None:
        """GPT-2 style init: N(0, 0.02), residual output projections scaled by 1/sqrt(2·layers)."""
        residual_std = 0.02 / math.sqrt(2 * self.spec.layers)
        for name, mod in self.named_modules():
            if isinstance(mod, nn.Linear):
                std = residual_std if name.endswith(("attn.proj", "mlp.out")) else 0.02
                if not (self.spec.tied_embeddings and mod is self.head):
                    nn.init.normal_(mod.weight, 0.0, std)
                if mod.bias is not None:
                    nn.init.zeros_(mod.bias)
            elif isinstance(mod, nn.Embedding):
                nn.init.normal_(mod.weight, 0.0, 0.02)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        x = self.drop(self.tok(idx) + self.pos(torch.arange(t, device=idx.device)))
        for block in self.blocks:
            if self.full_checkpointing and torch.is_grad_enabled():
                x = checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        logits = self.head(self.ln_f(x)).float()
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def build_model(spec: ModelSpec, max_seq_length: int, seed: int, dropout: float = 0.0,
                checkpointing: Checkpointing = "none") -> GPT:
    """A freshly initialised GPT on CPU whose weights depend only on ``seed`` (not on rank or layout)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = GPT(spec, max_seq_length, dropout, checkpointing)
    log.debug("built GPT with %d parameters", sum(p.numel() for p in model.parameters()))
    return model
