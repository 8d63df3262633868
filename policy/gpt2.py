"""GPT-2's forward in plain torch, for proposing in a build.

The policy network is a transformers ``GPT2LMHeadModel`` (``cudal2.policy.model``):
training and adapters use it as it is. A build only loads the committed weights and
samples from them (and, with ``policy_updates``, takes a few gradient steps), and
importing transformers' modelling code cost a fresh H100 machine most of the 19 s its
build spent loading the proposer, before any candidate could be compiled. This module is
the same network without that import: the same module and parameter names (so
``load_state_dict`` and ``adapter.merge_lora`` take the same weights), the same operations
in the same order (``torch.addmm`` with GPT-2's ``Conv1D`` layout, the tanh GELU, layer
norms, ``scaled_dot_product_attention`` called as transformers' ``sdpa`` path calls it),
and a key/value cache with what ``model.sample`` and ``model.score`` use of transformers'
``DynamicCache``. ``tests/policy/test_gpt2.py`` checks logits and gradients against the
installed transformers bit for bit.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch
from torch import nn
from torch.nn import functional as F


class Output(NamedTuple):
    """What the policy reads of a forward: ``logits`` and the cache."""

    logits: torch.Tensor
    past_key_values: Cache


class Cache:
    """Per layer, the keys and values seen so far ([batch, heads, positions, head dim])."""

    def __init__(self) -> None:
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []

    def seen(self) -> int:
        return self.keys[0].shape[-2] if self.keys else 0

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if layer == len(self.keys):
            self.keys.append(k)
            self.values.append(v)
        else:
            self.keys[layer] = torch.cat([self.keys[layer], k], dim=-2)
            self.values[layer] = torch.cat([self.values[layer], v], dim=-2)
        return self.keys[layer], self.values[layer]

    def batch_repeat_interleave(self, repeats: int) -> None:
        self.keys = [k.repeat_interleave(repeats, dim=0) for k in self.keys]
        self.values = [v.repeat_interleave(repeats, dim=0) for v in self.values]


class Conv1D(nn.Module):
    """GPT-2's linear layer: ``weight`` is [in, out], applied as ``addmm(bias, x, weight)``."""

    def __init__(self, n_out: int, n_in: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_in, n_out))
        self.bias = nn.Parameter(torch.zeros(n_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight)
        return out.view(*x.shape[:-1], self.bias.shape[0])


def gelu_new(x: torch.Tensor) -> torch.Tensor:
    """GPT-2's ``gelu_new`` (transformers' ``NewGELUActivation``), term for term."""
    return (
        0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))
    )


class Attention(nn.Module):
    def __init__(self, n_embd: int, n_head: int, layer: int):
        super().__init__()
        self.n_head, self.head_dim, self.layer = n_head, n_embd // n_head, layer
        self.c_attn = Conv1D(3 * n_embd, n_embd)
        self.c_proj = Conv1D(n_embd, n_embd)

    def forward(self, h: torch.Tensor, cache: Cache, past: int) -> torch.Tensor:
        """``past``: the positions the cache held before this forward."""
        q, k, v = self.c_attn(h).split(h.shape[-1], dim=2)
        q, k, v = (t.view(*t.shape[:-1], -1, self.head_dim).transpose(1, 2) for t in (q, k, v))
        k, v = cache.update(self.layer, k, v)
        q_len, kv_len = q.shape[2], k.shape[2]
        # transformers' causal mask for sdpa: none for one new position (it sees all) or
        # for a causal block from position 0, else a boolean mask (True: attends)
        mask = None
        causal = q_len > 1 and past == 0
        if q_len > 1 and past > 0:
            rows = torch.arange(q_len).unsqueeze(1) + past
            mask = (torch.arange(kv_len).unsqueeze(0) <= rows)[None, None].expand(
                q.shape[0], 1, q_len, kv_len
            )
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=0.0, scale=self.head_dim**-0.5, is_causal=causal
        )
        out = out.reshape(out.shape[0], -1, q_len, v.shape[-1]).transpose(1, 2).contiguous()
        return self.c_proj(out.reshape(*out.shape[:-2], -1).contiguous())


class MLP(nn.Module):
    def __init__(self, n_embd: int):
        super().__init__()
        self.c_fc = Conv1D(4 * n_embd, n_embd)
        self.c_proj = Conv1D(n_embd, 4 * n_embd)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.c_proj(gelu_new(self.c_fc(h)))


class Block(nn.Module):
    def __init__(self, n_embd: int, n_head: int, layer: int, eps: float):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd, eps=eps)
        self.attn = Attention(n_embd, n_head, layer)
        self.ln_2 = nn.LayerNorm(n_embd, eps=eps)
        self.mlp = MLP(n_embd)

    def forward(self, h: torch.Tensor, cache: Cache, past: int) -> torch.Tensor:
        h = self.attn(self.ln_1(h), cache, past) + h
        return h + self.mlp(self.ln_2(h))


class Body(nn.Module):
    def __init__(self, vocab: int, n_positions: int, n_embd: int, n_layer: int, n_head: int):
        super().__init__()
        eps = 1e-5  # GPT2Config's layer_norm_epsilon
        self.wte = nn.Embedding(vocab, n_embd)
        self.wpe = nn.Embedding(n_positions, n_embd)
        self.h = nn.ModuleList(Block(n_embd, n_head, i, eps) for i in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd, eps=eps)


class GPT2(nn.Module):
    """``GPT2LMHeadModel``'s forward for ``input_ids`` and a cache (the head tied to the
    token embedding, no dropout: the policy's config sets every dropout to 0)."""

    def __init__(self, vocab: int, n_positions: int, n_embd: int, n_layer: int, n_head: int):
        super().__init__()
        self.transformer = Body(vocab, n_positions, n_embd, n_layer, n_head)

    def forward(
        self,
        input_ids: torch.Tensor,
        past_key_values: Cache | None = None,
        use_cache: bool | None = None,
    ) -> Output:
        cache = past_key_values if past_key_values is not None else Cache()
        t = self.transformer
        past = cache.seen()
        positions = (torch.arange(input_ids.shape[1]) + past).unsqueeze(0)
        h = t.wte(input_ids) + t.wpe(positions)
        for block in t.h:
            h = block(h, cache, past)
        h = t.ln_f(h)
        return Output(F.linear(h, t.wte.weight), cache)


def from_state(state: dict[str, Any], n_positions: int, n_layer: int, n_head: int) -> GPT2:
    """The network holding ``state`` (a GPT2LMHeadModel state dict, ``lm_head.weight``
    left out or equal to the embedding); ``KeyError``/``RuntimeError`` where it does not
    fit."""
    vocab, n_embd = state["transformer.wte.weight"].shape
    model = GPT2(vocab, n_positions, n_embd, n_layer, n_head)
    own = {k: v for k, v in state.items() if k != "lm_head.weight" and not k.endswith(".attn.bias")}
    model.load_state_dict(own, strict=True)
    return model.eval()
