"""The torch side of the RoPE + KV-cache epilogues (``abi.ROPE_KV``: ``rmsnorm_rope_kv``,
``rmsnorm_bias_rope_kv``; docs/kernels.md, "RoPE and the KV-cache write in the qkv
epilogue"): the qkv weight's row packing, the operand rules, and the one reference of
what the epilogue does after the GEMM (used by the build's verification, in fp32, and as
the runtime's fallback).

The epilogue, per row m = b * seq + s of y = rs[m] * (A B^T)[m] (+ bias), y in B's packed
column order: for a q or k head h, the pair (x0, x1) at packed columns h*D + 2i, h*D +
2i + 1 is (original column i, original column i + D/2), and

    out[i]       = x0 * cos[m, i]       - x1 * sin[m, i]
    out[i + D/2] = x1 * cos[m, i + D/2] + x0 * sin[m, i + D/2]

(transformers' ``q * cos + rotate_half(q) * sin``); q heads go to the output [M, q_heads
* D], k head h to ``k_cache[b, h, positions[s], :]``, v head h (natural order, not
rotated) to ``v_cache[b, h, positions[s], :]``. One rounding to the output dtype.

Self-contained (ships inside wheels as ``_runtime``): the standard library and torch,
which every function here is handed tensors of (imported at the first call).
"""

from __future__ import annotations

from typing import Any

from .abi import RopeKvArgs


def _torch() -> Any:
    import torch  # the caller holds tensors, so this is a dictionary lookup

    return torch


def check_heads(op: str, n: int, heads: Any) -> tuple[int, int, int]:
    """``heads`` as (q_heads, kv_heads, head_dim) if it splits N = ``n`` (three positive
    integers, an even head_dim, N == (q_heads + 2 kv_heads) * head_dim); else
    ValueError naming ``heads``."""
    if (
        not isinstance(heads, (tuple, list))
        or len(heads) != 3
        or any(isinstance(h, bool) or not isinstance(h, int) or h < 1 for h in heads)
    ):
        raise ValueError(
            f"{op}: heads must be three positive integers (q_heads, kv_heads, head_dim), "
            f"got {heads!r}"
        )
    q, kv, d = heads
    if d % 2:
        raise ValueError(f"{op}: heads: head_dim {d} must be even (RoPE rotates pairs)")
    if (q + 2 * kv) * d != n:
        raise ValueError(
            f"{op}: heads {tuple(heads)}: N = {n} is not (q_heads + 2 kv_heads) * head_dim "
            f"= {(q + 2 * kv) * d}"
        )
    return q, kv, d


def rope_row_permutation(q_heads: int, kv_heads: int, head_dim: int) -> list[int]:
    """``perm[r]``: the original qkv row at packed row ``r``. Within every q and k head
    of D rows, packed row h*D + 2i is original h*D + i and h*D + 2i + 1 is original
    h*D + i + D/2 (i < D/2): each RoPE pair is two adjacent columns of the product; the
    v rows keep their order."""
    half = head_dim // 2
    perm = []
    for h in range(q_heads + kv_heads):
        base = h * head_dim
        for i in range(half):
            perm += [base + i, base + i + half]
    start = (q_heads + kv_heads) * head_dim
    perm += range(start, start + kv_heads * head_dim)
    return perm


def pack_rope_rows(w: Any, heads: Any) -> Any:
    """The qkv weight [N, K] (or its bias [N]) with its rows in the packed order the
    ROPE_KV epilogues read (``rope_row_permutation``). A new tensor."""
    if not isinstance(w, _torch().Tensor) or w.dim() not in (1, 2):
        raise ValueError("pack_rope_rows: w must be a qkv weight [N, K] or bias [N] tensor")
    perm = rope_row_permutation(*check_heads("pack_rope_rows", w.shape[0], heads))
    return w.index_select(0, _torch().tensor(perm, device=w.device))


def unpack_rope_rows(w: Any, heads: Any) -> Any:
    """``pack_rope_rows``' inverse: the rows back in the original q, k, v order."""
    if not isinstance(w, _torch().Tensor) or w.dim() not in (1, 2):
        raise ValueError("unpack_rope_rows: w must be a packed [N, K] or [N] tensor")
    perm = rope_row_permutation(*check_heads("unpack_rope_rows", w.shape[0], heads))
    inverse = [0] * len(perm)
    for packed, original in enumerate(perm):
        inverse[original] = packed
    return w.index_select(0, _torch().tensor(inverse, device=w.device))


def _need(op: str, name: str, t: Any) -> None:
    if not isinstance(t, _torch().Tensor):
        raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")


def check_operands(
    op: str,
    m: int,
    n: int,
    dtype: Any,
    device: Any,
    heads: Any,
    cos: Any,
    sin: Any,
    k_cache: Any,
    v_cache: Any,
    positions: Any,
    read_positions: bool = True,
) -> tuple[int, int, int]:
    """The rules a ROPE_KV epilogue's operands must meet for a GEMM of M = ``m`` rows
    and N = ``n`` in ``dtype`` on ``device``; the head split, or a clear error naming the
    operand: cos and sin of the output's dtype, contiguous (row stride D), [M, D] (one
    row per row of x) or [seq, D] (shared by the batch: transformers' [1, seq, D] when
    every sequence is at the same positions), any leading dims; the caches [B, kv_heads,
    L, D] of the output's dtype, unit inner stride, B = M / seq, one L; positions int64
    [seq] with M % seq == 0, and on the CPU every position in [0, L) (on a GPU they are
    not read back: that would synchronise; the kernel writes nothing for a position
    outside [0, L)); ``read_positions`` False: not even there (a fake tensor's values,
    while tracing)."""
    q, kv, d = check_heads(op, n, heads)
    for name, t in (("cos", cos), ("sin", sin), ("k_cache", k_cache), ("v_cache", v_cache)):
        _need(op, name, t)
        if t.dtype != dtype:
            raise ValueError(f"{op}: {name} is {t.dtype} but the output is {dtype}")
        if t.device != device:
            raise ValueError(f"{op}: {name} is on {t.device} but x on {device}")
    _need(op, "positions", positions)
    seq = positions.numel() if positions.dim() == 1 else 0
    for name, t in (("cos", cos), ("sin", sin)):
        rows = t.numel() // d if t.dim() >= 1 and t.shape[-1] == d else -1
        if rows not in (m, seq) or not t.is_contiguous():
            raise ValueError(
                f"{op}: {name} must be a contiguous [M, head_dim] = [{m}, {d}] or [seq, "
                f"head_dim] = [{seq}, {d}] tensor (any leading dims), got shape "
                f"{tuple(t.shape)} strides {tuple(t.stride())}"
            )
    if cos.numel() != sin.numel():
        raise ValueError(f"{op}: sin {tuple(sin.shape)} is not cos's shape {tuple(cos.shape)}")
    if positions.dtype != _torch().int64 or positions.dim() != 1 or positions.numel() < 1:
        raise ValueError(
            f"{op}: positions must be a 1-D int64 tensor [seq], got {positions.dtype} "
            f"shape {tuple(positions.shape)}"
        )
    if positions.device != device:
        raise ValueError(f"{op}: positions is on {positions.device} but x on {device}")
    seq = positions.numel()
    if m % seq:
        raise ValueError(f"{op}: positions: M = {m} rows is not a whole number of seq = {seq}")
    batch = m // seq
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if t.dim() != 4 or (t.shape[0], t.shape[1], t.shape[3]) != (batch, kv, d):
            raise ValueError(
                f"{op}: {name} must be [B, kv_heads, L, head_dim] = [{batch}, {kv}, L, {d}], "
                f"got shape {tuple(t.shape)}"
            )
        if t.stride(3) != 1:
            raise ValueError(f"{op}: {name} must have a unit inner stride, got {t.stride()}")
    if k_cache.shape[2] != v_cache.shape[2]:
        raise ValueError(
            f"{op}: k_cache holds L = {k_cache.shape[2]} slots but v_cache {v_cache.shape[2]}"
        )
    if read_positions and positions.device.type == "cpu":
        low, high = int(positions.min()), int(positions.max())
        if low < 0 or high >= k_cache.shape[2]:
            raise ValueError(
                f"{op}: positions must lie in [0, {k_cache.shape[2]}) (the caches' L), got "
                f"{positions.tolist()[:8]}"
            )
    return q, kv, d


def kernel_args(heads: tuple[int, int, int], cos, sin, k_cache, v_cache, positions) -> RopeKvArgs:
    """The kernel's ROPE_KV operands (``abi.RopeKvArgs``) of checked tensors
    (``check_operands``)."""
    q, kv, d = heads
    seq = positions.numel()
    per_row = cos.numel() == k_cache.shape[0] * seq * d  # [M, D]; else [seq, D], shared
    return RopeKvArgs(
        cos.data_ptr(),
        sin.data_ptr(),
        k_cache.data_ptr(),
        v_cache.data_ptr(),
        positions.data_ptr(),
        seq,
        seq if per_row else 0,
        k_cache.shape[2],
        q,
        kv,
        d,
        tuple(k_cache.stride()[:3]),
        tuple(v_cache.stride()[:3]),
    )


def rotated(y: Any, cos: Any, sin: Any, heads: tuple[int, int, int]) -> tuple[Any, Any, Any]:
    """(q, k, v) in fp32 of y [M, N] (the row-scaled, biased product in the packed column
    order): q [M, q_heads, D] and k [M, kv_heads, D] rotated, v [M, kv_heads, D], in
    each head's natural order. The one reference of the epilogue's arithmetic."""
    q_heads, kv_heads, d = heads
    m = y.shape[0]
    half = d // 2
    y = y.float()
    qk = y[:, : (q_heads + kv_heads) * d].reshape(m, q_heads + kv_heads, half, 2)
    x0, x1 = qk[..., 0], qk[..., 1]  # original columns i and i + D/2 of each head
    # [seq, D] shared by the batch: row m = b * seq + s takes row s
    c = cos.reshape(-1, d).float().repeat(m * d // cos.numel(), 1).reshape(m, 1, d)
    s = sin.reshape(-1, d).float().repeat(m * d // sin.numel(), 1).reshape(m, 1, d)
    lo = x0 * c[..., :half] - x1 * s[..., :half]
    hi = x1 * c[..., half:] + x0 * s[..., half:]
    out = _torch().cat((lo, hi), -1)
    v = y[:, (q_heads + kv_heads) * d :].reshape(m, kv_heads, d)
    return out[:, :q_heads], out[:, q_heads:], v


def write_cache(cache: Any, rows: Any, positions: Any) -> None:
    """``rows`` [M, heads, D] (row m = b * seq + s) into ``cache`` [B, heads, L, D] at
    slots ``positions`` [seq], rounded to the cache's dtype: StaticCache's
    ``index_copy_`` along the slot dimension."""
    seq = positions.numel()
    m, h, d = rows.shape
    by_batch = rows.reshape(m // seq, seq, h, d).transpose(1, 2).to(cache.dtype)
    cache.index_copy_(2, positions, by_batch)


def epilogue(
    y: Any,
    cos: Any,
    sin: Any,
    k_cache: Any,
    v_cache: Any,
    positions: Any,
    heads: tuple[int, int, int],
) -> Any:
    """What a ROPE_KV kernel does after its row scale and bias, on y [M, N] (packed
    columns): k and v written into the caches, q [M, q_heads * D] returned in fp32."""
    q, k, v = rotated(y, cos, sin, heads)
    write_cache(k_cache, k, positions)
    write_cache(v_cache, v, positions)
    return q.reshape(q.shape[0], -1)


def fallback(
    x: Any,
    w: Any,
    eps: float,
    bias: Any,
    cos: Any,
    sin: Any,
    k_cache: Any,
    v_cache: Any,
    positions: Any,
    heads: tuple[int, int, int],
) -> Any:
    """The runtime's fallback of ``linear_rope_kv``: torch's RMSNorm of x [..., K] and
    F.linear on the packed weight (with the packed bias) in x's dtype, then
    ``epilogue`` in fp32; q [..., q_heads * D] in x's dtype."""
    from .fused import rms_normed

    lead = x.shape[:-1]
    y = _torch().nn.functional.linear(rms_normed(x, eps), w, bias)
    q = epilogue(y.reshape(-1, y.shape[-1]), cos, sin, k_cache, v_cache, positions, heads)
    return q.to(x.dtype).contiguous().reshape(*lead, q.shape[-1])
