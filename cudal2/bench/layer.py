"""One Llama decoder layer in decode, written three ways for ``cudal2-bench layer``.

- ``reference``: fp32, separate q/k/v/gate/up weights, attention written out (softmax
  of q·Kᵀ/√d over the cache, the kv heads repeated for GQA): the yardstick.
- ``VendorLayer``: as a serving engine runs it with vendor GEMMs: packed qkv and gate_up
  weights (one ``F.linear`` each), the small pieces (RMSNorm, residual add + RMSNorm,
  RoPE, SiLU·mul, the last residual add) as ``torch.compile``d functions, attention by
  ``F.scaled_dot_product_attention`` over the KV cache.
- ``Cudal2Layer``: the same layer with every GEMM through a cudal2 package's ``linear``,
  and, where the package has them (``fusions``), its fused ops in place of a GEMM and
  the small op it absorbs. Attention, RoPE and the cache write are the same code.

A decode step: M sequences, one new token each at position ``CACHE_TOKENS - 1``; the
cache holds the ``CACHE_TOKENS - 1`` tokens before it, the layer writes the new token's
k/v into the last slot and attends over all ``CACHE_TOKENS``. A tensor-parallel shard
(``tp`` > 1) is one GPU's part of the layer: heads, kv heads and the intermediate size
divided by ``tp`` (so o_proj and down_proj see K/tp); the all-reduces after o_proj and
down_proj are not part of it (no collective is timed), and the residual adds are kept
where a single GPU has them.

Everything here also runs on the CPU in float32 (no graphs, no compile: ``compiled=False``),
so the tests check the math of all three against each other.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

CACHE_TOKENS = 1024
CONFIGS = Path(__file__).resolve().parents[2] / "manifests" / "configs"
# Llama-3.1-70B's published config differs from the 8B's in these fields only (and in
# its layer count and vocabulary, which one layer does not see).
LLAMA_70B = {
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
}
MODELS: dict[str, tuple[str, dict[str, int], int]] = {  # name -> (config, overrides, tp)
    "llama-3.1-8b": ("llama-3.1-8b", {}, 1),
    "llama-3.1-70b-tp8": ("llama-3.1-8b", LLAMA_70B, 8),
}

GEMMS = ("qkv", "o_proj", "gate_up", "down")  # in the order a layer runs them


@dataclass(frozen=True)
class LayerShape:
    """One GPU's decoder layer: per-GPU head counts and intermediate size."""

    model: str
    tp: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    eps: float
    rope: dict[str, Any] = field(hash=False)  # rope_theta and rope_scaling of the config

    def gemms(self) -> dict[str, tuple[int, int]]:
        """Each GEMM's (N, K) as the vendor layer runs it (qkv and gate_up packed)."""
        d = self.head_dim
        return {
            "qkv": ((self.heads + 2 * self.kv_heads) * d, self.hidden),
            "o_proj": (self.hidden, self.heads * d),
            "gate_up": (2 * self.intermediate, self.hidden),
            "down": (self.hidden, self.intermediate),
        }

    def weight_bytes(self, itemsize: int = 2) -> int:
        return itemsize * sum(n * k for n, k in self.gemms().values())

    def cache_bytes(self, m: int, itemsize: int = 2) -> int:
        return itemsize * 2 * m * self.kv_heads * CACHE_TOKENS * self.head_dim

    def as_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["gemms_nk"] = {name: list(nk) for name, nk in self.gemms().items()}
        d["cache_tokens"] = CACHE_TOKENS
        return d


def layer_shape(model: str) -> LayerShape:
    """The per-GPU layer of a model in ``MODELS``; KeyError names the known ones."""
    if model not in MODELS:
        raise KeyError(f"unknown model {model!r} (known: {', '.join(MODELS)})")
    config, overrides, tp = MODELS[model]
    c = {**json.loads((CONFIGS / config / "config.json").read_text()), **overrides}
    heads, kv, inter = c["num_attention_heads"], c["num_key_value_heads"], c["intermediate_size"]
    if heads % tp or kv % tp or inter % tp:
        raise ValueError(f"{model}: heads {heads}, kv heads {kv}, intermediate {inter} by tp {tp}")
    return LayerShape(
        model=model,
        tp=tp,
        hidden=c["hidden_size"],
        heads=heads // tp,
        kv_heads=kv // tp,
        head_dim=c.get("head_dim") or c["hidden_size"] // heads,
        intermediate=inter // tp,
        eps=c["rms_norm_eps"],
        rope={"rope_theta": c["rope_theta"], "rope_scaling": c.get("rope_scaling")},
    )


# -- the pieces both layers share ------------------------------------------------------


def inv_freq(shape: LayerShape) -> Any:
    """RoPE's inverse frequencies, with Llama 3's frequency-dependent scaling (the
    long wavelengths divided by ``factor``, a smooth ramp between)."""
    import torch

    d = shape.head_dim
    base = 1.0 / shape.rope["rope_theta"] ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    s = shape.rope.get("rope_scaling")
    if not s:
        return base.float()
    assert s["rope_type"] == "llama3", s
    factor, low, high = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    old = s["original_max_position_embeddings"]
    wavelen = 2 * math.pi / base
    scaled = torch.where(wavelen > old / low, base / factor, base)
    smooth = (old / wavelen - low) / (high - low)
    medium = (wavelen <= old / low) & (wavelen >= old / high)
    scaled = torch.where(medium, (1 - smooth) * scaled / factor + smooth * scaled, scaled)
    return scaled.float()


def rope_cos_sin(shape: LayerShape, position: int, device: Any = None) -> tuple[Any, Any]:
    """cos and sin [head_dim] at one position (fp32), halves repeated as Llama does."""
    import torch

    f = position * inv_freq(shape).to(device)
    emb = torch.cat([f, f])
    return emb.cos(), emb.sin()


def rmsnorm(x: Any, w: Any, eps: float) -> Any:
    """Llama's RMSNorm: in fp32, rounded to x's dtype, then times the weight."""
    import torch

    x32 = x.float()
    y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return w * y.to(x.dtype)


def add_rmsnorm(x: Any, r: Any, w: Any, eps: float) -> tuple[Any, Any]:
    """The residual add and the next norm, one function (as serving engines fuse them)."""
    s = x + r
    return s, rmsnorm(s, w, eps)


def add(x: Any, r: Any) -> Any:
    return x + r


def silu_mul(gu: Any) -> Any:
    """SiLU(gate) · up of a packed [M, 2I] gate_up output (gate first)."""
    import torch.nn.functional as F

    g, u = gu.chunk(2, dim=-1)
    return F.silu(g) * u


def _rotate(x: Any, cos: Any, sin: Any) -> Any:
    import torch

    x1, x2 = x.chunk(2, dim=-1)
    rot = torch.cat([-x2, x1], dim=-1)
    return (x.float() * cos + rot.float() * sin).to(x.dtype)


def rope_split(qkv: Any, cos: Any, sin: Any, heads: int, kv_heads: int) -> tuple[Any, Any, Any]:
    """Split a packed [M, (H + 2 KV) D] qkv output into q [M, H, D], k, v [M, KV, D],
    and rotate q and k (in fp32, rounded back)."""
    m = qkv.shape[0]
    x = qkv.view(m, heads + 2 * kv_heads, -1)
    q, k, v = x.split([heads, kv_heads, kv_heads], dim=1)
    return _rotate(q, cos, sin), _rotate(k, cos, sin), v


def attention(q: Any, k: Any, v: Any, k_cache: Any, v_cache: Any) -> Any:
    """Write the new token's k/v into the cache's last slot, then SDPA of the one query
    per sequence over all ``CACHE_TOKENS`` (GQA: kv heads shared by heads/kv_heads
    query heads). q [M, H, D], caches [M, KV, T, D] -> [M, H·D]."""
    import torch.nn.functional as F

    k_cache[:, :, -1].copy_(k)
    v_cache[:, :, -1].copy_(v)
    o = F.scaled_dot_product_attention(q.unsqueeze(2), k_cache, v_cache, enable_gqa=True)
    return o.reshape(q.shape[0], -1)


# -- weights and decode state ----------------------------------------------------------


@dataclass
class LayerWeights:
    """One layer's weights, unpacked ([N, K] each), and its two RMSNorm weights."""

    q: Any
    k: Any
    v: Any
    o: Any
    gate: Any
    up: Any
    down: Any
    in_norm: Any
    post_norm: Any

    def to(self, dtype: Any) -> LayerWeights:
        return LayerWeights(**{n: t.to(dtype) for n, t in vars(self).items()})

    def qkv(self) -> Any:
        import torch

        return torch.cat([self.q, self.k, self.v])

    def gate_up(self) -> Any:
        import torch

        return torch.cat([self.gate, self.up])


@dataclass
class DecodeState:
    """One decode step's inputs: the residual stream x [M, hidden] and the KV cache
    [M, KV, CACHE_TOKENS, D] (its last slot is written by the layer)."""

    x: Any
    k_cache: Any
    v_cache: Any

    def to(self, dtype: Any) -> DecodeState:
        return DecodeState(self.x.to(dtype), self.k_cache.to(dtype), self.v_cache.to(dtype))


def make_weights(shape: LayerShape, dtype: Any, device: Any, gen: Any) -> LayerWeights:
    """Random weights scaled by 1/√K (activations stay near unit size through the
    layer), norm weights near 1. Never zeros: zeros run faster and hide bugs."""
    import torch

    def w(n: int, k: int) -> Any:
        t = torch.randn(n, k, generator=gen, device=device) / math.sqrt(k)
        return t.to(dtype)

    d, h = shape.head_dim, shape.hidden
    return LayerWeights(
        q=w(shape.heads * d, h),
        k=w(shape.kv_heads * d, h),
        v=w(shape.kv_heads * d, h),
        o=w(h, shape.heads * d),
        gate=w(shape.intermediate, h),
        up=w(shape.intermediate, h),
        down=w(h, shape.intermediate),
        in_norm=(1 + 0.1 * torch.randn(h, generator=gen, device=device)).to(dtype),
        post_norm=(1 + 0.1 * torch.randn(h, generator=gen, device=device)).to(dtype),
    )


def make_state(shape: LayerShape, m: int, dtype: Any, device: Any, gen: Any) -> DecodeState:
    import torch

    cache = (m, shape.kv_heads, CACHE_TOKENS, shape.head_dim)
    return DecodeState(
        x=torch.randn(m, shape.hidden, generator=gen, device=device).to(dtype),
        k_cache=torch.randn(cache, generator=gen, device=device).to(dtype),
        v_cache=torch.randn(cache, generator=gen, device=device).to(dtype),
    )


# -- the three layers ------------------------------------------------------------------


def reference(shape: LayerShape, w: LayerWeights, s: DecodeState) -> Any:
    """The layer in fp32 from unpacked weights, attention written out. ``s``'s cache
    is read, not written (its last slot is replaced by this token's k/v on a copy)."""
    import torch

    f32 = torch.float32
    w, x = w.to(f32), s.x.to(f32)
    m, d = x.shape[0], shape.head_dim
    cos, sin = rope_cos_sin(shape, CACHE_TOKENS - 1, x.device)

    def norm(t: Any, g: Any) -> Any:
        return g * t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + shape.eps)

    def rot(t: Any) -> Any:
        t1, t2 = t.chunk(2, dim=-1)
        return t * cos + torch.cat([-t2, t1], dim=-1) * sin

    h = norm(x, w.in_norm)
    q = rot((h @ w.q.T).view(m, shape.heads, d))
    k = rot((h @ w.k.T).view(m, shape.kv_heads, d))
    v = (h @ w.v.T).view(m, shape.kv_heads, d)
    kc, vc = s.k_cache.to(f32).clone(), s.v_cache.to(f32).clone()
    kc[:, :, -1], vc[:, :, -1] = k, v
    group = shape.heads // shape.kv_heads
    kc, vc = kc.repeat_interleave(group, dim=1), vc.repeat_interleave(group, dim=1)
    scores = torch.einsum("mhd,mhtd->mht", q, kc) / math.sqrt(d)
    a = torch.einsum("mht,mhtd->mhd", scores.softmax(-1), vc).reshape(m, -1)
    x2 = x + a @ w.o.T
    h2 = norm(x2, w.post_norm)
    mlp = torch.nn.functional.silu(h2 @ w.gate.T) * (h2 @ w.up.T)
    return x2 + mlp @ w.down.T


@dataclass
class Pieces:
    """The small functions, compiled (``torch.compile``, one specialisation per case)
    or, on the CPU, as they are."""

    rmsnorm: Callable[..., Any]
    add_rmsnorm: Callable[..., Any]
    add: Callable[..., Any]
    silu_mul: Callable[..., Any]
    rope_split: Callable[..., Any]

    @classmethod
    def make(cls, compiled: bool) -> Pieces:
        fns = {"rmsnorm": rmsnorm, "add_rmsnorm": add_rmsnorm, "add": add}
        fns |= {"silu_mul": silu_mul, "rope_split": rope_split}
        if compiled:
            import torch

            fns = {n: torch.compile(f, dynamic=False, fullgraph=True) for n, f in fns.items()}
        return cls(**fns)


class VendorLayer:
    """The layer with vendor GEMMs (``F.linear`` on packed qkv and gate_up weights)."""

    def __init__(self, shape: LayerShape, w: LayerWeights, pieces: Pieces):
        self.shape, self.p = shape, pieces
        self.w_qkv, self.w_o, self.w_gu, self.w_down = w.qkv(), w.o, w.gate_up(), w.down
        self.in_norm, self.post_norm = w.in_norm, w.post_norm
        cos, sin = rope_cos_sin(shape, CACHE_TOKENS - 1, w.o.device)
        self.cos, self.sin = cos, sin

    def __call__(self, s: DecodeState) -> Any:
        import torch.nn.functional as F

        sh, p = self.shape, self.p
        h = p.rmsnorm(s.x, self.in_norm, sh.eps)
        q, k, v = p.rope_split(F.linear(h, self.w_qkv), self.cos, self.sin, sh.heads, sh.kv_heads)
        a = attention(q, k, v, s.k_cache, s.v_cache)
        x2, h2 = p.add_rmsnorm(s.x, F.linear(a, self.w_o), self.post_norm, sh.eps)
        mlp = p.silu_mul(F.linear(h2, self.w_gu))
        return p.add(x2, F.linear(mlp, self.w_down))


# A fused op is used where the package has every attribute it names; the signatures:
#   linear_residual(x, w, residual) -> x wᵀ + residual
#   linear_gated(x, pack_gate_up(gate, up), "silu") -> silu(x gateᵀ) · (x upᵀ)
#   linear_rmsnorm(h, fold_rmsnorm(w, norm_weight), eps) -> rmsnorm(h) wᵀ
#   linear_gated(h, fold_rmsnorm(pack_gate_up(gate, up), norm_weight), "silu", eps)
#       -> silu(rmsnorm(h) gateᵀ) · (rmsnorm(h) upᵀ)   (both "gated" and "rmsnorm")
# (the packers are the package's: its kernels decide how gate/up interleave and how the
# norm weight is folded; folding is per column, so it commutes with the row packing).
FUSIONS: dict[str, tuple[str, ...]] = {
    "residual": ("linear_residual",),
    "gated": ("linear_gated", "pack_gate_up"),
    "rmsnorm": ("linear_rmsnorm", "fold_rmsnorm"),
}


def fusions(pkg: Any) -> dict[str, bool]:
    """Which fused ops ``pkg`` exposes (every attribute of ``FUSIONS[name]`` present)."""
    return {name: all(hasattr(pkg, a) for a in attrs) for name, attrs in FUSIONS.items()}


# What each plan value of a GEMM calls (``none``: the package's ``linear``).
PLAN_OPS = {
    "none": "linear",
    "residual": "linear_residual",
    "gated": "linear_gated",
    "rmsnorm": "linear_rmsnorm",
    "rmsnorm_gated": "linear_gated",
}


def plan(available: dict[str, bool]) -> dict[str, str]:
    """What runs each GEMM: ``none`` (the package's ``linear``) or the fused op that
    absorbs its neighbour (``PLAN_OPS``). gate_up takes, best first: the gated op with
    the post-attention norm folded (``rmsnorm_gated``: epilogue ``rmsnorm_silu``, so
    with the residual ops o_proj -> gate_up -> down run back to back, no kernel
    between), the gated op (it removes the larger elementwise kernel: [M, 2I] read,
    [M, I] written), the folded norm."""
    gated, norm = available.get("gated", False), available.get("rmsnorm", False)
    gate_up = (
        "rmsnorm_gated" if gated and norm else "gated" if gated else "rmsnorm" if norm else "none"
    )
    return {
        "qkv": "rmsnorm" if available["rmsnorm"] else "none",
        "o_proj": "residual" if available["residual"] else "none",
        "gate_up": gate_up,
        "down": "residual" if available["residual"] else "none",
    }


class Cudal2Layer:
    """The layer with every GEMM through ``pkg`` (its ``linear``, or a fused op where
    ``plan`` chose one). Assigning a dict to ``probe`` records, per GEMM, the package's
    ``stats`` of that one call (for the results: kernel, cuBLASLt entry or fallback)."""

    def __init__(self, shape: LayerShape, w: LayerWeights, pieces: Pieces, pkg: Any):
        self.shape, self.p, self.pkg = shape, pieces, pkg
        self.plan = plan(fusions(pkg))
        self.probe: dict[str, Any] | None = None
        self.in_norm, self.post_norm = w.in_norm, w.post_norm
        self.cos, self.sin = rope_cos_sin(shape, CACHE_TOKENS - 1, w.o.device)
        pl = self.plan
        self.w_qkv = pkg.fold_rmsnorm(w.qkv(), w.in_norm) if pl["qkv"] == "rmsnorm" else w.qkv()
        self.w_o, self.w_down = w.o, w.down
        if pl["gate_up"] == "rmsnorm_gated":
            # packed once: gate and up rows interleaved, the norm weight folded in
            self.w_gu = pkg.fold_rmsnorm(pkg.pack_gate_up(w.gate, w.up), w.post_norm)
        elif pl["gate_up"] == "gated":
            self.w_gu = pkg.pack_gate_up(w.gate, w.up)
        elif pl["gate_up"] == "rmsnorm":
            self.w_gu = pkg.fold_rmsnorm(w.gate_up(), w.post_norm)
        else:
            self.w_gu = w.gate_up()

    def _gemm(self, name: str, op: str, *args: Any) -> Any:
        stats = getattr(self.pkg, "stats", None) if self.probe is not None else None
        if stats is not None:
            stats.reset()
        out = getattr(self.pkg, op)(*args)
        if stats is not None:
            self.probe[name] = {"op": op, **stats.as_dict()}
        return out

    def __call__(self, s: DecodeState) -> Any:
        sh, p, pl = self.shape, self.p, self.plan
        if pl["qkv"] == "rmsnorm":
            qkv = self._gemm("qkv", "linear_rmsnorm", s.x, self.w_qkv, sh.eps)
        else:
            qkv = self._gemm("qkv", "linear", p.rmsnorm(s.x, self.in_norm, sh.eps), self.w_qkv)
        q, k, v = p.rope_split(qkv, self.cos, self.sin, sh.heads, sh.kv_heads)
        a = attention(q, k, v, s.k_cache, s.v_cache)
        h2 = None  # the post-attention norm's output, where gate_up does not fold it
        folded = pl["gate_up"] in ("rmsnorm", "rmsnorm_gated")
        if pl["o_proj"] == "residual":
            x2 = self._gemm("o_proj", "linear_residual", a, self.w_o, s.x)
            if not folded:
                h2 = p.rmsnorm(x2, self.post_norm, sh.eps)
        elif folded:
            x2 = p.add(s.x, self._gemm("o_proj", "linear", a, self.w_o))
        else:
            o = self._gemm("o_proj", "linear", a, self.w_o)
            x2, h2 = p.add_rmsnorm(s.x, o, self.post_norm, sh.eps)
        if pl["gate_up"] == "rmsnorm_gated":
            mlp = self._gemm("gate_up", "linear_gated", x2, self.w_gu, "silu", sh.eps)
        elif pl["gate_up"] == "gated":
            mlp = self._gemm("gate_up", "linear_gated", h2, self.w_gu, "silu")
        elif pl["gate_up"] == "rmsnorm":
            mlp = p.silu_mul(self._gemm("gate_up", "linear_rmsnorm", x2, self.w_gu, sh.eps))
        else:
            mlp = p.silu_mul(self._gemm("gate_up", "linear", h2, self.w_gu))
        if pl["down"] == "residual":
            return self._gemm("down", "linear_residual", mlp, self.w_down, x2)
        return p.add(x2, self._gemm("down", "linear", mlp, self.w_down))
