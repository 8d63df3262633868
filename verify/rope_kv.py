"""Verifying the RoPE + KV-cache epilogues (``records.ROPE_KV``): their operands, the
fp32 reference, torch's unfused sequence (the yardstick and the timing baseline) and
what a run wrote, for ``correctness``, ``inputs``, the worker and the checks.

A target's rows are ``batch`` sequences of ``seq`` tokens (``layout``: seq 2 where M is
even, so both the batch and the token index of a row are exercised; 1 otherwise); the
caches hold ``length`` slots, filled with a random pattern, and the slots the kernel
must write (``positions``, distinct, random) are NaN: an unwritten slot reads as an
unwritten output element. The kernel's output is then read back as one [M, N] matrix,
C (q) then the written k and v slots, in the heads' natural order
(``written``), checked like any output against the reference's [M, N] (``reference``);
every other cache element must be unchanged bit for bit.

torch's unfused sequence (``vendor``) is what transformers runs: RMSNorm, F.linear on
the qkv weight in its original row order (``qkv_weight``, ``qkv_bias``: unpacked from
the packed B and bias once per operand set, so the baseline pays no permutation),
``q * cos + rotate_half(q) * sin`` on q and on k, and the two caches' ``index_copy_``.
"""

from __future__ import annotations

import math
from typing import Any

from cudal2.packaging.runtime import rope_kv as runtime_rope_kv
from cudal2.packaging.runtime.abi import RopeKvArgs
from cudal2.records import Target

# The operands a ROPE_KV trial adds (the names the kernel's launch reads, and the
# natural-order weight and bias torch's sequence runs on).
CACHES = ("k_cache", "v_cache")
READ_ONLY = ("cos", "sin", "positions", "qkv_weight", "qkv_bias")


def layout(t: Target) -> tuple[int, int, int]:
    """(batch, seq, length) of a ROPE_KV target's rows and caches."""
    seq = 2 if t.m % 2 == 0 else 1
    return t.m // seq, seq, 2 * seq + 6


def operands(t: Target, gen, dtype, device: str, b, bias=None) -> dict[str, Any]:
    """cos, sin [M, D] (of random angles), the caches [batch, kv_heads, length, D]
    (uniform(-1, 1), the slots to be written NaN), positions int64 [seq] (distinct,
    random), and the natural-order ``qkv_weight`` (and ``qkv_bias``) of the packed
    ``b`` (and ``bias``) for torch's sequence."""
    import torch

    _, kv, d = t.heads
    batch, seq, length = layout(t)
    angle = torch.rand((t.m, d), generator=gen, device=device) * (2 * math.pi)
    out: dict[str, Any] = {"cos": angle.cos().to(dtype), "sin": angle.sin().to(dtype)}
    positions = torch.randperm(length, generator=gen, device=device)[:seq].to(torch.int64)
    for name in CACHES:
        u = torch.rand((batch, kv, length, d), generator=gen, device=device) * 2 - 1
        u[:, :, positions] = float("nan")
        out[name] = u.to(dtype)
    out["positions"] = positions
    out["qkv_weight"] = runtime_rope_kv.unpack_rope_rows(b, t.heads)
    if bias is not None:
        out["qkv_bias"] = runtime_rope_kv.unpack_rope_rows(bias, t.heads)
    return out


def kernel_args(t: Target, epi: dict[str, Any]) -> RopeKvArgs:
    """The kernel's ROPE_KV operands of a trial's (or a set's) tensors."""
    return runtime_rope_kv.kernel_args(
        t.heads, epi["cos"], epi["sin"], epi["k_cache"], epi["v_cache"], epi["positions"]
    )


def reference(t: Target, y, epi: dict[str, Any]):
    """The fp32 reference [M, N] of the row-scaled, biased product y (packed columns):
    q, k rotated and v, each head in its natural order."""
    import torch

    q, k, v = runtime_rope_kv.rotated(y, epi["cos"], epi["sin"], t.heads)
    return torch.cat([x.reshape(t.m, -1) for x in (q, k, v)], 1)


def slots(t: Target, cache, positions):
    """The rows [M, kv_heads * D] a run wrote into ``cache`` (row m = b * seq + s at
    slot positions[s] of batch b)."""
    batch, seq, _ = layout(t)
    got = cache.index_select(2, positions)  # [batch, kv, seq, D]
    return got.transpose(1, 2).reshape(batch * seq, -1)


def written(t: Target, c, epi: dict[str, Any], drawn: dict[str, Any]) -> tuple[Any, str]:
    """What a run wrote, as [M, N]: C then the k and v slots; and why it fails ("" when
    it does not) if it changed any cache element outside the slots (``drawn``: the
    caches as drawn, the run's were copies)."""
    import torch

    why = []
    mask = torch.ones(drawn["k_cache"].shape[2], dtype=torch.bool, device=c.device)
    mask[epi["positions"]] = False
    for name in CACHES:
        before = drawn[name][:, :, mask].view(torch.int16)
        after = epi[name][:, :, mask].view(torch.int16)
        changed = int((before != after).sum())
        if changed:
            why.append(f"{changed} elements of {name} outside the written slots changed")
    out = torch.cat([c.float(), *(slots(t, epi[n], epi["positions"]).float() for n in CACHES)], 1)
    return out, "; ".join(why)


def _rotate_half(x):
    import torch

    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), -1)


def vendor(t: Target, xn, epi: dict[str, Any], out=None):
    """torch's unfused sequence after its RMSNorm (``xn``, the working dtype), as
    transformers runs it: F.linear on the natural-order weight (and bias), q and k
    rotated (``q * cos + rotate_half(q) * sin``), k and v ``index_copy_``'d into the
    caches; q [M, q_heads * D] into ``out`` (or a new tensor)."""
    import torch.nn.functional as F

    q_heads, kv_heads, d = t.heads
    batch, seq, _ = layout(t)
    y = F.linear(xn, epi["qkv_weight"], epi.get("qkv_bias"))
    y = y.view(batch, seq, q_heads + 2 * kv_heads, d)
    q = y[:, :, :q_heads].transpose(1, 2)
    k = y[:, :, q_heads : q_heads + kv_heads].transpose(1, 2)
    v = y[:, :, q_heads + kv_heads :].transpose(1, 2)
    cos = epi["cos"].view(batch, 1, seq, d)
    sin = epi["sin"].view(batch, 1, seq, d)
    q = q * cos + _rotate_half(q) * sin
    k = k * cos + _rotate_half(k) * sin
    epi["k_cache"].index_copy_(2, epi["positions"], k)
    epi["v_cache"].index_copy_(2, epi["positions"], v)
    q = q.transpose(1, 2).reshape(t.m, q_heads * d)
    if out is None:
        return q
    return out.copy_(q)


def vendor_output(t: Target, xn, epi: dict[str, Any]):
    """torch's sequence on copies of the caches, read back as [M, N] (``written``'s
    order): the yardstick's output."""
    mine = {**epi, **{n: epi[n].clone() for n in CACHES}}
    q = vendor(t, xn, mine)
    out, _ = written(t, q, mine, epi)
    return out


# -- the checks' children (compute-sanitizer, Nsight Compute): host-side operands --


def shapes(t: Target) -> dict[str, tuple[int, ...]]:
    """The 16-bit operands' shapes (cos, sin, the caches; contiguous)."""
    _, kv, d = t.heads
    batch, _, length = layout(t)
    return {
        "cos": (t.m, d),
        "sin": (t.m, d),
        **dict.fromkeys(CACHES, (batch, kv, length, d)),
    }


def host_positions(t: Target):
    """The positions a child launches with (int64, slots 0 .. seq - 1)."""
    import numpy as np

    return np.arange(layout(t)[1], dtype=np.int64)


def contiguous_args(t: Target, ptrs: dict[str, int], positions_ptr: int) -> RopeKvArgs:
    """The kernel's ROPE_KV operands of contiguous ones at these device pointers."""
    q, kv, d = t.heads
    _, seq, length = layout(t)
    strides = (kv * length * d, length * d, d)
    return RopeKvArgs(
        ptrs["cos"], ptrs["sin"], ptrs["k_cache"], ptrs["v_cache"], positions_ptr, seq, seq,
        length, q, kv, d, strides, strides,
    )  # fmt: skip
