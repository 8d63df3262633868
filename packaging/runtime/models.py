"""``patch_model``: a Hugging Face transformers decoder run through the fused, chained ops.

Per decoder layer the layer's class is swapped for a subclass whose forward runs

    qkv = linear_rmsnorm(h, fold_rmsnorm([W_q; W_k; W_v], input_norm), eps, [b_q; b_k; b_v])
    q, k, v = split(qkv); rotary; cache update; the model's own attention function
    h = linear_residual(attn, W_o, h)                       # the residual add, fused
    g = linear_gated(h, fold_rmsnorm(pack_gate_up(W_gate, W_up), post_norm), act, eps)
    h = linear_residual(g, W_down, h)

so o -> gate_up -> down -> the next layer's qkv are GEMMs back to back, nothing between
(Gemma-2 keeps its post-attention / post-feedforward norms: they sit between the GEMM and
the residual add, so o_proj and down_proj run through plain ``linear`` there and the add
stays torch's). The LM head (``head="rmsnorm"``) runs the final norm and the head as one
``linear_rmsnorm`` on a weight with the final norm folded in (the norm module passes its
input on while patched); ``head="linear"`` keeps it plain (``ops.patch_linear`` on that
one module). Rotary, the cache update and attention
are the family's own functions (its module's ``apply_rotary_pos_emb``, transformers'
``ALL_ATTENTION_FUNCTIONS`` with the model's ``_attn_implementation``, eager as the
default), with the arguments the family's attention passes them, so sdpa / eager /
flash and static or dynamic caches behave as in the unpatched model.

The path per call: from its M (rows of the hidden states; static under torch.compile),
a layer runs the fused forward where every fused-epilogue GEMM of it has a kernel entry
at that M (``Api.m_ranges`` on the layer's device, read once at patch time) and, with
grouped decode on, a decode call (one new token a sequence) also where a GEMM's entry is
a fallback (the build's measured choice of torch's unfused math for it, which the fused
op then runs: the grouped attention and the other kernels are kept); elsewhere,
with the originals kept, its class's own forward on the original modules (the unpatched
layer, bit for bit: never slower than unpatched), or with ``uncovered="fused"`` (and
``originals`` "cpu" / "drop", which take the originals away) the fused forward, each
uncovered op on torch's unfused math over the packed weights. The LM head decides the
same way. ``report()`` says per layer which GEMMs have a table entry, at which M, and
(``paths``) which path each M asked for or seen took.
Inference only (``model.eval()``). What it does not know it refuses before touching the
model (``PatchModelError``, naming the model type / config key and value).

Memory: the folded qkv and gate_up weights are new tensors (the norm weight is folded in,
so they cannot alias the originals), and so is the folded LM head weight; o_proj and
down_proj are used as they are. ``originals`` decides what happens to the replaced
weights (q/k/v/gate/up, or Phi-3's qkv_proj/gate_up_proj, and the LM head's unless it is
tied to the embedding): ``"keep"`` (default: nothing moves, ``restore()`` is free and
exact; they cost their bytes a second time), ``"cpu"`` (moved to host memory, moved back
by ``restore()``, bit for bit; the parameter objects are kept, so anything sharing them
sees them on the CPU while patched), ``"drop"`` (freed; ``restore()`` unfolds them from
the packed weights: lossy, one rounding). ``ModelPatch.memory()`` reports the bytes added
(or freed, negative) on each device.

Self-contained (ships inside wheels as ``_runtime``): the standard library, torch and
transformers (imported at the call: the caller holds a transformers model).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

from . import fused
from .api import NORMED_TWINS, dtype_name
from .families import ACTS, BIAS_KEYS, FAMILIES, HEADS, Family, Gemm, layer_gemms
from .ops import LinearPatch, patch_linear
from .rope_kv import pack_rope_rows, unpack_rope_rows

ORIGINALS = ("keep", "cpu", "drop")
# The model types whose attention ``rope_kv=True`` fuses (transformers' rotate_half RoPE
# over the whole head, q/k/v projections of their own)
ROPE_KV_MODEL_TYPES = ("llama", "mistral", "qwen2")
# What a call at an M the table has no fused entry for runs (module docstring).
UNCOVERED = ("original", "fused")
# The modeling code the fused forward matches (argument names, the cache's ``update``,
# ``ALL_ATTENTION_FUNCTIONS.get_interface``): transformers 5 (read from 5.23). transformers
# 4 passes ``past_key_value`` and the static cache wants ``cache_position``: refused.
MIN_TRANSFORMERS = (5, 0)
# Buffers the patch registers on a layer (non-persistent: not in state_dict).
_BUFFERS = ("_cudal2_w_qkv", "_cudal2_b_qkv", "_cudal2_w_gate_up")
# The report's name of each projection (families.PROJECTIONS are the manifest's).
_REPORT_NAMES = {"qkv": "qkv", "o": "o_proj", "gate_up": "gate_up", "down": "down"}


class PatchModelError(ValueError):
    """A model (or a configuration of it) ``patch_model`` does not know; the message
    names the model type and the config key or module and its value."""


@dataclass(frozen=True)
class GemmReport:
    """One GEMM of a patched layer: the op that runs it, its epilogue and (N, K), and
    whether the table has an entry for (dtype, N, K, epilogue) (``entries``: GPU and M
    range of each) or the op falls back to torch's unfused math (``fallback``: why);
    ``m_ranges``: the M ranges at which a call on the layer's device launches an entry
    (``Api.m_ranges``; a CPU layer: on any GPU of the table); ``decided``: at which the
    table has any entry, a fallback entry too (the build measured torch's unfused math
    fastest there: the op runs it, as the table says)."""

    gemm: str
    op: str
    epilogue: str
    n: int
    k: int
    dtype: str
    entries: tuple[str, ...]
    fallback: str | None
    m_ranges: tuple[tuple[int, int], ...] = ()
    decided: tuple[tuple[int, int], ...] = ()

    def as_json(self) -> dict:
        return {
            "gemm": self.gemm,
            "op": self.op,
            "epilogue": self.epilogue,
            "n": self.n,
            "k": self.k,
            "dtype": self.dtype,
            "entries": list(self.entries),
            "fallback": self.fallback,
            "m_ranges": [list(r) for r in self.m_ranges],
        }


# The path a patched layer (or the LM head) takes at one M: every fused GEMM has a
# kernel entry there ("fused"); it has not, and the layer runs its class's own forward
# on the original modules ("original"); it has not, and the fused forward runs anyway,
# its uncovered ops on torch's unfused math over the packed weights ("fused_fallback").
PATHS = ("fused", "original", "fused_fallback")


@dataclass
class _Route:
    """Which path a call at M takes: ``fused_ms`` the M ranges where every fused GEMM
    of the layer has a kernel entry (a tuple of int pairs: a constant to dynamo, so the
    choice costs nothing under torch.compile and is part of the traced graph),
    ``decode_ms`` where a decode call (one new token a sequence) takes the fused forward
    too (every fused GEMM has an entry, a kernel or a fallback), and ``uncovered`` what
    runs elsewhere (``UNCOVERED``). ``seen``: M -> path of the eager calls made
    (compiled calls are traced once and not counted)."""

    fused_ms: tuple[tuple[int, int], ...]
    uncovered: str
    seen: dict[int, str] = field(default_factory=dict)
    decode_ms: tuple[tuple[int, int], ...] = ()

    def path(self, m: int, decode: bool = False) -> str:
        for lo, hi in (*self.fused_ms, *(self.decode_ms if decode else ())):
            if lo <= m <= hi:
                return "fused"
        return "original" if self.uncovered == "original" else "fused_fallback"


@dataclass
class _Plan:
    """A patched layer's scalars and functions (its weights are buffers on the layer)."""

    family: Family
    act: str
    eps_in: float
    eps_mlp: float
    split: tuple[int, int, int]
    rotary: Any
    eager_attention: Any
    attention_functions: Any
    ops: Any  # torch.ops.<namespace>: under torch.compile or where autograd records
    api: Any  # the Api: plain inference (the same dispatch, no dispatcher cost)
    route: _Route
    rope: _Rope | None = None  # rope_kv=True: RoPE and the cache write in the qkv kernel
    # "math": ``_grouped_decode_math`` at one token; "sdpa": ``_grouped_decode_sdpa`` at
    # one token from GROUPED_MIN_KV_ROWS pairs; False: transformers' attention
    grouped_decode: str | bool = False


@dataclass(frozen=True)
class _Rope:
    """A layer patched with ``rope_kv=True``: its qkv weight (and bias) are in the packed
    RoPE row order (``rope_kv.pack_rope_rows``) of ``heads`` (q_heads, kv_heads,
    head_dim); ``ms``: the M ranges the table has a ``*_rope_kv`` kernel for."""

    heads: tuple[int, int, int]
    ms: tuple[tuple[int, int], ...]

    def takes(self, m: int, path: str) -> bool:
        """Whether a call at M runs ``linear_rope_kv``: where a kernel serves it, or on
        the layer's unfused-math path (the op's own fallback is that math)."""
        return path == "fused_fallback" or any(lo <= m <= hi for lo, hi in self.ms)


@dataclass
class _HeadPlan:
    """The patched LM head's: the final norm it folds (its module and original class),
    the norm's eps, the ops, and its route."""

    norm: Any
    norm_cls: type
    eps: float
    ops: Any
    api: Any
    route: _Route


@dataclass
class _Moved:
    """One replaced original weight: where it was and how to bring it back."""

    param: Any
    device: Any
    unfold: Any = None  # "drop": () -> the weight, recomputed from the packed one


@dataclass
class _Patched:
    name: str
    layer: Any
    cls: type
    gemms: list[GemmReport]
    route: _Route
    moved: list[_Moved] = field(default_factory=list)


@dataclass
class _Head:
    """The folded LM head: the head and its final norm, their original classes."""

    head: Any
    cls: type
    plan: _HeadPlan
    moved: list[_Moved] = field(default_factory=list)


def _intersect(
    a: tuple[tuple[int, int], ...], b: tuple[tuple[int, int], ...]
) -> tuple[tuple[int, int], ...]:
    """The M ranges in both ``a`` and ``b`` (each ascending, disjoint)."""
    out = []
    for lo1, hi1 in a:
        for lo2, hi2 in b:
            lo, hi = max(lo1, lo2), min(hi1, hi2)
            if lo <= hi:
                out.append((lo, hi))
    return tuple(sorted(out))


class ModelPatch:
    """What ``patch_model`` did: ``report()`` (per layer, per GEMM: table entry or
    fallback; per M, the path), ``memory()`` (bytes added per device), ``restore()``
    (also as a context manager)."""

    def __init__(
        self,
        layers: list[_Patched],
        head: LinearPatch | _Head | None,
        head_report: Any,
        originals: str,
        added: dict[str, int],
    ):
        self._layers = layers
        self._head = head
        self._head_report = head_report
        self.originals = originals
        self._added = added

    @property
    def names(self) -> list[str]:
        """Qualified names of the patched decoder layers (and the LM head, if patched)."""
        head = self._head
        patched = isinstance(head, _Head) or (head is not None and head.names)
        return [p.name for p in self._layers] + (["lm_head"] if patched else [])

    def report(self, ms: Any = ()) -> dict:
        """Per decoder layer its GEMMs (``GemmReport.as_json``), and the LM head's;
        ``paths``: per layer (and ``lm_head`` where folded), per M (a string key) the
        path (``PATHS``) of every eager call seen (as it took it) and of each M in ``ms``
        asked for (as a call of several tokens a sequence takes it)."""
        ms = [int(m) for m in ms]
        routes = {p.name: p.route for p in self._layers}
        if isinstance(self._head, _Head):
            routes["lm_head"] = self._head.plan.route
        paths = {  # a seen call's own path (a decode call's can differ from ``path(m)``)
            name: {str(m): r.seen.get(m) or r.path(m) for m in sorted({*ms, *r.seen})}
            for name, r in routes.items()
        }
        return {
            "layers": {p.name: [g.as_json() for g in p.gemms] for p in self._layers},
            "lm_head": None if self._head_report is None else self._head_report.as_json(),
            "paths": paths,
        }

    def memory(self) -> dict[str, int]:
        """Bytes the patch added on each device (``str(device)``), the packed weights
        less the originals moved off it (negative where it freed more than it added)."""
        return dict(self._added)

    def restore(self) -> None:
        """The original classes, weights and forwards, bit for bit (``"drop"``: the
        weights unfolded from the packed ones, one rounding from the originals)."""
        for p in self._layers:
            layer = p.layer
            _bring_back(p.moved)  # before the packed buffers go: "drop" unfolds from them
            if getattr(type(layer), "_cudal2_original", None) is p.cls:
                layer.__class__ = p.cls
            for name in _BUFFERS:
                layer._buffers.pop(name, None)
            layer.__dict__.pop("_cudal2", None)
        head = self._head
        if isinstance(head, _Head):
            _bring_back(head.moved)
            for module, cls in ((head.head, head.cls), (head.plan.norm, head.plan.norm_cls)):
                if getattr(type(module), "_cudal2_original", None) is cls:
                    module.__class__ = cls
                module.__dict__.pop("_cudal2", None)
            head.head._buffers.pop("_cudal2_w_head", None)
        elif head is not None:
            head.restore()
        self._layers, self._head, self._added = [], None, {}

    def __enter__(self) -> ModelPatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.restore()

    def __repr__(self) -> str:
        return f"ModelPatch({len(self._layers)} layers, originals={self.originals!r})"


def _bring_back(moved: list[_Moved]) -> None:
    for m in moved:
        data = m.unfold() if m.unfold is not None else m.param.data
        m.param.data = data.to(m.device)


# -- the fused forward ----------------------------------------------------------------

_torch: Any = None
_CLASSES: dict[tuple[type, str], type] = {}


def _tokens(x: Any) -> int:
    """M of a call: the rows of x [..., K] (static under torch.compile: part of the shape)."""
    m = 1
    for d in x.shape[:-1]:
        m *= d
    return m


# The grouped call runs one SDPA program per (sequence, KV head): below this many it
# leaves the GPU idle and loses to transformers' copy of the cache (measured on an H200,
# bench/results/h200-grouped-sdpa.json, 32 layers at a 1,024-token context: Llama-3.1-8B
# (8 KV heads) 0.82x at batch 1, 0.99x at 2, 1.68x at 4; Qwen2-7B (4 KV heads) 0.89x at
# batch 2, 1.48x at 4; a first run: 0.67x, 1.00x, 1.69x and 0.89x, 1.49x).
GROUPED_MIN_KV_ROWS = 16
# patch_model's grouped_decode values: True is "math", the form measured faster end to end
# at every batch (bench/results/h200-llama-kv-e2e-grouped-math.json: 1.30x at batch 1,
# 1.46x at 4, 1.98x at 16, 2.95x at 64, against 1.12x, 1.28x, 1.95x and 2.88x with "sdpa")
GROUPED_DECODE = {True: "math", False: False, "math": "math", "sdpa": "sdpa"}


def _grouped_decode(p: _Plan, attn: Any, q: Any, k: Any, extra: dict) -> bool:
    """Whether a patched layer's attention takes the grouped call: asked for
    (``patch_model(grouped_decode=True, "math" or "sdpa")``), one new token a sequence,
    for ``"sdpa"`` at least ``GROUPED_MIN_KV_ROWS`` (sequence, KV head) pairs, SDPA the
    model's attention, fewer KV heads than query heads, and nothing SDPA's own call would
    not express (a soft cap)."""
    return (
        p.grouped_decode in ("math", "sdpa")
        and q.shape[2] == 1
        and (p.grouped_decode == "math" or q.shape[0] * k.shape[1] >= GROUPED_MIN_KV_ROWS)
        and attn.config._attn_implementation == "sdpa"
        and k.shape[1] < q.shape[1]
        and q.shape[1] % k.shape[1] == 0
        and extra.get("softcap") is None
        and not attn.training
    )


def _grouped_decode_sdpa(torch: Any, q: Any, k: Any, v: Any, mask: Any, scaling: float) -> Any:
    """SDPA for one new token a sequence with grouped KV heads, the cache read in place:
    the query heads sharing a KV head become that head's queries ([b, kv heads, group,
    d]; head h = kv head h // group, as ``repeat_kv`` pairs them), where transformers'
    path under ``torch.compile`` expands every KV head group-fold, a copy of the whole
    cache each layer (its ``pack_gqa`` is skipped when compiling). The mask ([b, 1, 1,
    kv], or None) broadcasts over the group. Returns [b, 1, heads, d], as transformers'
    attention functions do."""
    b, heads, _, d = q.shape
    kv_heads = k.shape[1]
    grouped = q.reshape(b, kv_heads, heads // kv_heads, d)
    o = torch.nn.functional.scaled_dot_product_attention(
        grouped, k, v, attn_mask=mask, dropout_p=0.0, scale=scaling
    )
    return o.reshape(b, heads, 1, d).transpose(1, 2)


def _grouped_decode_math(torch: Any, q: Any, k: Any, v: Any, mask: Any, scaling: float) -> Any:
    """``_grouped_decode_sdpa``'s attention as transformers' eager attention computes it
    (a matmul, the softmax in fp32, a matmul), over the grouped heads: [b, kv heads,
    group, d] against the cache in place. Returns [b, 1, heads, d]."""
    b, heads, _, d = q.shape
    kv_heads = k.shape[1]
    grouped = q.reshape(b, kv_heads, heads // kv_heads, d)
    scores = torch.matmul(grouped, k.transpose(2, 3)) * scaling
    if mask is not None:
        scores = (
            scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
        )
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(probs, v).reshape(b, heads, 1, d).transpose(1, 2)


def _fused_forward(
    self: Any,
    hidden_states: Any,
    *,
    attention_mask: Any = None,
    position_ids: Any = None,
    past_key_values: Any = None,
    position_embeddings: Any = None,
    **kwargs: Any,
) -> Any:
    p = self._cudal2
    if self.training:
        raise RuntimeError(
            f"{type(self).__name__} is patched for inference (cudal2 patch_model): "
            "restore() the patch before training"
        )
    torch = _torch
    # one new token a sequence: [b, 1, hidden] (static under torch.compile)
    path = p.route.path(_tokens(hidden_states), decode=hidden_states.shape[-2] == 1)
    if not torch.compiler.is_compiling():
        p.route.seen[_tokens(hidden_states)] = path
    if path == "original":
        # No fused entry at this M: the class's own forward over the original modules
        # (the patched layer is then the unpatched one, bit for bit).
        return self._cudal2_original.forward(
            self,
            hidden_states,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=past_key_values,
            position_embeddings=position_embeddings,
            **kwargs,
        )
    # Traced or recording autograd: the torch ops (the compiler sees them, CUDA graphs
    # capture them); plain inference: the Api's same dispatch without the dispatcher.
    ops = p.ops if torch.is_grad_enabled() or torch.compiler.is_compiling() else p.api
    attn = self.self_attn
    input_shape = hidden_states.shape[:-1]
    hidden_shape = (*input_shape, -1, attn.head_dim)
    cos, sin = position_embeddings
    # transformers >= 5.24 passes the cache as ``cache`` (``past_key_values`` before)
    cache = kwargs.pop("cache", None)
    cache = past_key_values if past_key_values is not None else cache
    static = None
    if p.rope is not None and p.rope.takes(_tokens(hidden_states), path):
        static = _static_layer(cache, attn.layer_idx)
    if static is not None:
        # RoPE and the cache write in the qkv kernel: k and v go straight into the static
        # cache's tensors at its next slots (what StaticLayer.update does), q comes back
        seq = hidden_states.shape[-2]
        positions = torch.arange(seq, device=static.keys.device) + static.cumulative_length
        static.cumulative_length.add_(seq)
        q = ops.linear_rope_kv(
            hidden_states, self._cudal2_w_qkv, p.eps_in, self._cudal2_b_qkv, cos, sin,
            static.keys, static.values, positions, list(p.rope.heads),
        )  # fmt: skip
        q = q.view(hidden_shape).transpose(1, 2)
        k, v = static.keys, static.values
    else:
        qkv = ops.linear_rmsnorm(hidden_states, self._cudal2_w_qkv, p.eps_in, self._cudal2_b_qkv)
        q, k, v = qkv.split(p.split, dim=-1)
        if p.rope is not None:  # the packed RoPE rows back in each head's own order
            q, k = _natural(q, p.rope.heads[2]), _natural(k, p.rope.heads[2])
        q = q.view(hidden_shape).transpose(1, 2)
        k = k.view(hidden_shape).transpose(1, 2)
        v = v.view(hidden_shape).transpose(1, 2)
        q, k = p.rotary(q, k, cos, sin)
        if cache is not None:
            k, v = cache.update(k, v, attn.layer_idx)
    extra = p.family.attn_kwargs(attn) if p.family.attn_kwargs else {}
    if _grouped_decode(p, attn, q, k, extra):
        grouped = _grouped_decode_sdpa if p.grouped_decode == "sdpa" else _grouped_decode_math
        o = grouped(torch, q, k, v, attention_mask, attn.scaling)
    else:
        attention = p.attention_functions.get_interface(
            attn.config._attn_implementation, p.eager_attention
        )
        o, _ = attention(
            attn,
            q,
            k,
            v,
            attention_mask,
            dropout=0.0,
            scaling=attn.scaling,
            position_ids=position_ids,
            **extra,
            **kwargs,
        )
    o = o.reshape(*input_shape, -1).contiguous()
    w_o, w_down = attn.o_proj.weight, self.mlp.down_proj.weight
    if p.family.post_norms:
        # Gemma-2: norm(o) + residual, norm(down) + residual: no residual epilogue fits.
        h = hidden_states + self.post_attention_layernorm(ops.linear(o, w_o))
        g = ops.linear_gated(h, self._cudal2_w_gate_up, p.act, p.eps_mlp)
        return h + self.post_feedforward_layernorm(ops.linear(g, w_down))
    h = ops.linear_residual(o, w_o, hidden_states)
    g = ops.linear_gated(h, self._cudal2_w_gate_up, p.act, p.eps_mlp)
    return ops.linear_residual(g, w_down, h)


def _natural(x: Any, head_dim: int) -> Any:
    """Columns [..., h * D] in the packed RoPE order (pairs i, i + D/2 side by side) back
    in each head's own order (a copy)."""
    half = head_dim // 2
    return x.unflatten(-1, (-1, half, 2)).transpose(-1, -2).flatten(-3)


def _static_layer(cache: Any, index: int) -> Any:
    """The cache's layer ``index`` where it is a full-length, initialised static layer
    (transformers' ``StaticLayer``: [B, kv_heads, L, D] tensors, ``cumulative_length``
    the next slot), else None (no cache, a dynamic or sliding one, or the first call,
    which allocates it: the layer's other path)."""
    layers = getattr(cache, "layers", None)
    if layers is None or index >= len(layers):
        return None
    from transformers.cache_utils import StaticLayer

    layer = layers[index]
    if type(layer) is not StaticLayer or not layer.is_initialized:
        return None
    return layer


def _head_forward(self: Any, x: Any) -> Any:
    """The LM head with the final norm folded in: ``linear_rmsnorm`` of the un-normalised
    hidden states (the norm module passes them on unchanged). Where the table has no
    kernel at this M and the originals are kept: the final norm's own forward, then the
    head's (the unpatched model's ops, bit for bit; the norm is per row, so it commutes
    with ``logits_to_keep``'s row slice)."""
    h = self._cudal2
    torch = _torch
    path = h.route.path(_tokens(x))
    if not torch.compiler.is_compiling():
        h.route.seen[_tokens(x)] = path
    if path == "original":
        return self._cudal2_original.forward(self, h.norm_cls.forward(h.norm, x))
    ops = h.ops if torch.is_grad_enabled() or torch.compiler.is_compiling() else h.api
    return ops.linear_rmsnorm(x, self._cudal2_w_head, h.eps)


def _passthrough(self: Any, x: Any) -> Any:
    """The final norm of a model whose LM head folds it: nothing (the head normalises)."""
    return x


def _fused_class(cls: type, forward: Any = _fused_forward) -> type:
    sub = _CLASSES.get((cls, forward.__name__))
    if sub is None:
        sub = type(
            f"Cudal2Fused{cls.__name__}",
            (cls,),
            {"forward": forward, "_cudal2_original": cls},
        )
        _CLASSES[(cls, forward.__name__)] = sub
    return sub


# -- checks: everything is refused before anything changes ------------------------------


def _refuse(model_type: str, what: str) -> PatchModelError:
    return PatchModelError(f"patch_model: {model_type}: {what}")


def _decoder(model: Any) -> tuple[Any, Any]:
    """(the decoder layers, the LM head or None) of a *ForCausalLM or its base model."""
    base = getattr(model, "model", model)
    layers = getattr(base, "layers", None)
    return layers, getattr(model, "lm_head", None)


def _linear(torch: Any, mt: str, name: str, module: Any, bias: bool) -> None:
    """A plain, floating-point nn.Linear with (or without) a bias, else refused."""
    if module is None:
        raise _refuse(mt, f"{name} is missing")
    if type(module) is not torch.nn.Linear:
        why = (
            "already patched by patch_linear: restore() it first"
            if hasattr(type(module), "_cudal2_original")
            else "not a plain torch.nn.Linear (a quantized or custom module?)"
        )
        raise _refuse(mt, f"{name} is {type(module).__name__}: {why}")
    w = module.weight
    if type(w).__name__ == "DTensor" or type(w) not in (torch.Tensor, torch.nn.Parameter):
        raise _refuse(
            mt, f"{name}.weight is a {type(w).__name__} (a tensor-parallel or quantized split)"
        )
    if not w.dtype.is_floating_point:
        raise _refuse(mt, f"{name}.weight is {w.dtype} (quantized?)")
    if bias and module.bias is None:
        raise _refuse(mt, f"{name} has no bias, where the family's q/k/v have one")
    if not bias and module.bias is not None:
        raise _refuse(mt, f"{name} has a bias, which the family has none of")


def transformers_version() -> tuple[int, int]:
    """(major, minor) of the installed transformers ((0, 0) without it)."""
    try:
        import transformers
    except ImportError:
        return (0, 0)
    parts = (transformers.__version__.split(".") + ["0"])[:2]
    return tuple(int("".join(c for c in p if c.isdigit()) or 0) for p in parts)


def _check_model(torch: Any, model: Any) -> tuple[str, Family, Any, Any]:
    config = getattr(model, "config", None)
    mt = getattr(config, "model_type", None)
    found = transformers_version()
    if found < MIN_TRANSFORMERS:
        raise PatchModelError(
            f"patch_model: transformers {'.'.join(map(str, found))} is older than "
            f"{'.'.join(map(str, MIN_TRANSFORMERS))}, whose modeling code the fused "
            "forward matches (tested with 5.23)"
        )
    if mt not in FAMILIES:
        raise PatchModelError(
            f"patch_model: model_type {mt!r} is not supported (supported: "
            f"{', '.join(sorted(FAMILIES))})"
        )
    fam = FAMILIES[mt]
    if model.training:
        raise _refuse(
            mt,
            "the model is in training mode: patch_model is for inference (call model.eval() first)",
        )
    quant = getattr(config, "quantization_config", None)
    if quant is not None or getattr(model, "is_quantized", False):
        raise _refuse(mt, f"quantization_config = {quant!r}: quantized models are not supported")
    tp = getattr(model, "_tp_size", None) or getattr(model, "tp_size", None)
    if tp not in (None, 1):
        raise _refuse(mt, f"tp_size = {tp}: tensor-parallel-split models are not supported")
    act = getattr(config, fam.act_key, None)
    if act not in ACTS:
        raise _refuse(mt, f"{fam.act_key} = {act!r} (supported: {', '.join(sorted(ACTS))})")
    for key in BIAS_KEYS:
        if getattr(config, key, False):
            raise _refuse(mt, f"{key} = True: the family's fused forward carries no such bias")
    layers, head = _decoder(model)
    if layers is None or not len(layers):
        raise _refuse(mt, "no decoder layers found (model.model.layers or model.layers)")
    if head is not None:
        _linear(torch, mt, "lm_head", head, bias=False)
    return mt, fam, layers, head


def _check_layer(torch: Any, mt: str, fam: Family, i: int, layer: Any) -> None:
    want = f"{fam.prefix}DecoderLayer"
    cls = type(layer)
    if hasattr(cls, "_cudal2_original"):
        raise _refuse(mt, f"layer {i} is already patched (restore() the earlier patch first)")
    if cls.__name__ != want:
        raise _refuse(mt, f"layer {i} is {cls.__name__}, not transformers' {want}")
    attn, mlp = layer.self_attn, layer.mlp
    mod = sys.modules.get(type(attn).__module__)
    if mod is None or not all(
        hasattr(mod, n) for n in ("apply_rotary_pos_emb", "eager_attention_forward")
    ):
        raise _refuse(mt, f"layer {i}: {type(attn).__module__} is not transformers' modeling code")
    norms = ["input_layernorm", "post_attention_layernorm"]
    if fam.post_norms:
        norms += ["pre_feedforward_layernorm", "post_feedforward_layernorm"]
    for n in norms:
        norm = getattr(layer, n, None)
        if norm is None or not type(norm).__name__.endswith("RMSNorm"):
            raise _refuse(mt, f"layer {i}.{n} is {type(norm).__name__}, not an RMSNorm")
    projs = ["qkv_proj"] if fam.fused_modules else ["q_proj", "k_proj", "v_proj"]
    for n in projs:
        _linear(torch, mt, f"layer {i}.self_attn.{n}", getattr(attn, n, None), fam.qkv_bias)
    _linear(torch, mt, f"layer {i}.self_attn.o_proj", getattr(attn, "o_proj", None), False)
    mlps = (
        ["gate_up_proj", "down_proj"]
        if fam.fused_modules
        else ["gate_proj", "up_proj", "down_proj"]
    )
    for n in mlps:
        _linear(torch, mt, f"layer {i}.mlp.{n}", getattr(mlp, n, None), False)
    c = attn.config
    heads, kv, d = c.num_attention_heads, c.num_key_value_heads, attn.head_dim
    q_out = sum(_proj_rows(attn, fam))
    if q_out != (heads + 2 * kv) * d or attn.o_proj.in_features != heads * d:
        raise _refuse(
            mt,
            f"layer {i}: q/k/v give {q_out} rows but num_attention_heads = {heads}, "
            f"num_key_value_heads = {kv}, head_dim = {d} give {(heads + 2 * kv) * d} "
            "(a tensor-parallel shard?)",
        )
    dtypes = {t.dtype for t in layer.parameters()}
    devices = {t.device for t in layer.parameters()}
    if len(dtypes) != 1 or len(devices) != 1:
        raise _refuse(
            mt,
            f"layer {i} mixes dtypes {sorted(map(str, dtypes))} / devices "
            f"{sorted(map(str, devices))}",
        )


def _proj_rows(attn: Any, fam: Family) -> list[int]:
    if fam.fused_modules:
        return [attn.qkv_proj.out_features]
    return [attn.q_proj.out_features, attn.k_proj.out_features, attn.v_proj.out_features]


# -- the packed weights ----------------------------------------------------------------


def _gemm_report(api: Any, name: str, gemm: Gemm, w: Any) -> GemmReport:
    """Whether the table has an entry for this GEMM: the lookup the Api makes (a
    ``kernel`` entry for a fused epilogue, ``covers`` for a plain GEMM), and the M
    ranges a call on w's device launches one at (``Api.m_ranges``)."""
    op, epilogue = gemm.op, gemm.epilogue
    n, k = w.shape
    dtype = dtype_name(w.dtype)
    if dtype is None:
        return GemmReport(name, op, epilogue, n, k, str(w.dtype), (), "dtype")
    entries = tuple(
        f"{e.gpu} M {e.m_min}-{e.m_max} {e.kind}"
        for e in api.table.entries
        if (e.dtype, e.layout, e.n, e.k, e.epilogue) == (dtype, "tn", n, k, epilogue)
    )

    def has(name: str) -> bool:  # the op's own check: a kernel entry of that epilogue
        return api.covers(n, k, dtype) if name == "none" else api._fuses(w.dtype, w, name)

    # ... or one of its twins', after torch's RMSNorm (``NORMED_TWINS``)
    hit = has(epilogue) or any(has(t) for t in NORMED_TWINS.get(epilogue, ()))
    device = w.device.index if w.is_cuda else None
    ranges = api.m_ranges(n, k, dtype, epilogue, device)
    decided = api.m_ranges(n, k, dtype, epilogue, device, decided=True)
    # no kernel: the table has a fallback entry for it (the build's measured choice of
    # torch's math there) or none at all
    why = None if hit else ("fallback_entry" if entries else "no_entry")
    return GemmReport(name, op, epilogue, n, k, dtype, entries, why, ranges, decided)


def _route(gemms: list[GemmReport], uncovered: str, grouped: bool = False) -> _Route:
    """The route of a layer whose GEMMs are ``gemms``: fused where every fused-epilogue
    GEMM has a kernel entry (plain ones fall back to the same ``F.linear`` the original
    layer runs, so they do not decide). ``grouped`` (the layer's attention takes the
    grouped decode form): a decode call is fused also where a GEMM's entry is a
    fallback (the build found torch's unfused math fastest for it there, and the fused
    op runs that), since the fused forward keeps the grouped attention and the other
    GEMMs' kernels; a prefill there is not (the fallback's math over the packed weights
    gains nothing and cost 2.4% of a 2,048-token prefill on an H200:
    bench/results/h200-llama-kv-e2e-fallback-all.json)."""
    fused_ms: tuple[tuple[int, int], ...] = ((1, 2**62),)
    decode_ms: tuple[tuple[int, int], ...] = ((1, 2**62),) if grouped else ()
    for g in gemms:
        if g.epilogue != "none":
            fused_ms = _intersect(fused_ms, g.m_ranges)
            decode_ms = _intersect(decode_ms, g.decided)
    return _Route(fused_ms, uncovered, decode_ms=decode_ms)


def _pack(torch: Any, fam: Family, layer: Any) -> tuple[Any, Any, Any, list[Any]]:
    """(folded qkv weight, qkv bias or None, folded gate_up weight, the original
    weights they replace)."""
    attn, mlp = layer.self_attn, layer.mlp
    off = fam.norm_offset
    g_in = layer.input_layernorm.weight
    g_mlp = getattr(layer, _mlp_norm_name(fam)).weight
    with torch.no_grad():
        if fam.fused_modules:
            qkv = attn.qkv_proj.weight
            w_qkv = fused.fold_rmsnorm(qkv, g_in, off)
            gu = mlp.gate_up_proj.weight  # [gate; up] stacked: re-packed into pairs
            gate, up = gu.chunk(2, 0)
            w_gu = fused.fold_rmsnorm(fused.pack_gate_up(gate, up), g_mlp, off)
            originals = [qkv, gu]
        else:
            ws = [attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]
            w_qkv = fused.fold_rmsnorm(torch.cat(ws), g_in, off)
            w_gu = fused.fold_rmsnorm(
                fused.pack_gate_up(mlp.gate_proj.weight, mlp.up_proj.weight), g_mlp, off
            )
            originals = [*ws, mlp.gate_proj.weight, mlp.up_proj.weight]
        b_qkv = None
        if fam.qkv_bias:
            b_qkv = torch.cat([attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias])
    return w_qkv, b_qkv, w_gu, originals


def _unfolders(fam: Family, layer: Any, originals: list[Any], heads: tuple = ()) -> list[Any]:
    """For ``"drop"``: per original weight, a function recomputing it from the packed
    weights (norm weight divided out in fp32, rounded once; the qkv rows put back in
    their order first where ``heads`` says they are in the packed RoPE order)."""
    off = fam.norm_offset
    g_in = layer.input_layernorm.weight
    g_mlp = getattr(layer, _mlp_norm_name(fam)).weight

    def unfold(packed: Any, g: Any) -> Any:
        return (packed.float() / (g.float() + off)).to(packed.dtype)

    def qkv_rows(lo: int, hi: int) -> Any:
        if not heads:
            return lambda: unfold(layer._cudal2_w_qkv[lo:hi], g_in)
        return lambda: unfold(unpack_rope_rows(layer._cudal2_w_qkv, heads)[lo:hi], g_in)

    def gate_up(which: int | None) -> Any:
        def get() -> Any:
            w = unfold(layer._cudal2_w_gate_up, g_mlp)
            pairs = w.unflatten(0, (-1, 2))
            if which is None:  # Phi-3: [gate; up] stacked
                return pairs.transpose(0, 1).reshape(w.shape).contiguous()
            return pairs[:, which].contiguous()

        return get

    if fam.fused_modules:
        return [qkv_rows(0, originals[0].shape[0]), gate_up(None)]
    rows = [t.shape[0] for t in originals[:3]]
    return [
        qkv_rows(0, rows[0]),
        qkv_rows(rows[0], rows[0] + rows[1]),
        qkv_rows(rows[0] + rows[1], sum(rows)),
        gate_up(0),
        gate_up(1),
    ]


def _mlp_norm_name(fam: Family) -> str:
    """The norm folded into gate_up (Gemma-2's pre-feedforward one; else the
    post-attention one)."""
    return "pre_feedforward_layernorm" if fam.post_norms else "post_attention_layernorm"


def _eps(norm: Any) -> float:
    eps = getattr(norm, "variance_epsilon", None)
    return float(norm.eps if eps is None else eps)


def _nbytes(t: Any) -> int:
    return t.numel() * t.element_size()


def patch_model(
    model: Any,
    api: Any,
    namespace: str,
    originals: str = "keep",
    uncovered: str | None = None,
    head: str = "rmsnorm",
    rope_kv: bool = False,
    grouped_decode: bool | str = True,
) -> ModelPatch:
    """Run ``model`` (a transformers Llama, Mistral, Qwen2, Gemma, Phi-3 or Gemma-2
    decoder, ``*ForCausalLM`` or its base model, in eval mode) through the package's
    fused ops, layer by layer (module docstring). ``originals``: ``"keep"``, ``"cpu"``
    or ``"drop"`` (what happens to the weights the packed ones replace). ``uncovered``:
    what a call at an M without a fused kernel entry runs: ``"original"`` (the layer's
    own forward; the default with ``"keep"``, which it needs) or ``"fused"`` (the fused
    forward, its ops on torch's unfused math; the default otherwise). ``head``:
    ``"rmsnorm"`` (the final norm folded into the LM head, one ``linear_rmsnorm``; a new
    [vocab, hidden] weight) or ``"linear"`` (the head as it is, through ``linear``: no
    memory). ``rope_kv`` (Llama, Mistral, Qwen2): the qkv weight in the packed RoPE row
    order, and where the cache is transformers' static one (initialised: from the second
    call) each layer's qkv GEMM applies RoPE and writes k and v into the cache itself
    (``linear_rope_kv``; its rotary and ``cache.update`` are skipped); no extra memory.
    ``grouped_decode`` (default ``True``, the same as ``"math"``): at one new token a
    sequence, the attention over the grouped KV heads in place, not transformers' copy of
    every KV head per query head under ``torch.compile`` (docs/inference.md, "Grouped
    decode"): as transformers' eager attention computes it (``_grouped_decode_math``, at
    any batch), or with ``"sdpa"`` one SDPA call (``_grouped_decode_sdpa``, from
    ``GROUPED_MIN_KV_ROWS`` (sequence, KV head) pairs); ``False``: transformers' attention.
    Refuses what it does not know with ``PatchModelError`` before changing anything."""
    global _torch
    import torch

    _torch = torch
    if originals not in ORIGINALS:
        raise ValueError(
            f"patch_model: originals must be one of {list(ORIGINALS)}, got {originals!r}"
        )
    if uncovered is None:
        uncovered = "original" if originals == "keep" else "fused"
    if uncovered not in UNCOVERED:
        raise ValueError(
            f"patch_model: uncovered must be one of {list(UNCOVERED)}, got {uncovered!r}"
        )
    if uncovered == "original" and originals != "keep":
        raise ValueError(
            f"patch_model: uncovered='original' runs the original modules, which "
            f"originals={originals!r} takes away: use originals='keep'"
        )
    if head not in HEADS:
        raise ValueError(f"patch_model: head must be one of {list(HEADS)}, got {head!r}")
    # bool or str only: 1 == True and 0 == False as dict keys
    if not isinstance(grouped_decode, bool | str) or grouped_decode not in GROUPED_DECODE:
        raise ValueError(
            f"patch_model: grouped_decode must be one of {list(GROUPED_DECODE)}, "
            f"got {grouped_decode!r}"
        )
    grouped_form = GROUPED_DECODE[grouped_decode]
    mt, fam, layers, lm_head = _check_model(torch, model)
    if rope_kv and mt not in ROPE_KV_MODEL_TYPES:
        raise _refuse(mt, f"rope_kv=True: the rope_kv epilogues serve {list(ROPE_KV_MODEL_TYPES)}")
    for i, layer in enumerate(layers):
        _check_layer(torch, mt, fam, i, layer)
    final_norm = _final_norm(mt, model) if lm_head is not None and head == "rmsnorm" else None
    tied = lm_head is not None and _tied(model, lm_head)
    if originals == "drop":
        folded = [  # what "drop" divides out
            (f"layer {i}.{n}", getattr(layer, n))
            for i, layer in enumerate(layers)
            for n in ("input_layernorm", _mlp_norm_name(fam))
        ]
        if final_norm is not None and not tied:
            folded.append(("norm", final_norm))
        for where, norm in folded:
            if bool((norm.weight.float() + fam.norm_offset == 0).any()):
                raise _refuse(
                    mt,
                    f"{where} has a zero scale: originals='drop' could not unfold it "
                    "(use 'keep' or 'cpu')",
                )
    ops = getattr(torch.ops, namespace)
    act = ACTS[getattr(model.config, fam.act_key)]
    prefix = "model.layers" if getattr(model, "model", None) is not None else "layers"
    added: dict[str, int] = {}

    def add(device: Any, n: int) -> None:
        key = str(device)
        added[key] = added.get(key, 0) + n

    def move(w: Any, unfold: Any, into: list[_Moved]) -> None:
        """Take ``w`` (a replaced original) off its device as ``originals`` says."""
        add(w.device, -_nbytes(w))
        into.append(_Moved(w, w.device, unfold if originals == "drop" else None))
        with torch.no_grad():
            if originals == "cpu":
                w.data = w.data.to("cpu")
                add("cpu", _nbytes(w))
            else:
                w.data = w.data.new_empty((0,))

    done: list[_Patched] = []
    for i, layer in enumerate(layers):
        attn = layer.self_attn
        mod = sys.modules[type(attn).__module__]
        w_qkv, b_qkv, w_gu, replaced = _pack(torch, fam, layer)
        rope = None
        if rope_kv:
            cfg = attn.config
            heads = (cfg.num_attention_heads, cfg.num_key_value_heads, attn.head_dim)
            with torch.no_grad():
                w_qkv = pack_rope_rows(w_qkv, heads)
                b_qkv = None if b_qkv is None else pack_rope_rows(b_qkv, heads)
            epilogue = "rmsnorm_rope_kv" if b_qkv is None else "rmsnorm_bias_rope_kv"
            n, k = w_qkv.shape
            device = w_qkv.device.index if w_qkv.is_cuda else None
            dtype = dtype_name(w_qkv.dtype)
            ms = () if dtype is None else api.m_ranges(n, k, dtype, epilogue, device)
            rope = _Rope(heads, ms)
        mlp_norm = getattr(layer, _mlp_norm_name(fam))
        weights = {
            "qkv": w_qkv,
            "o": attn.o_proj.weight,
            "gate_up": w_gu,
            "down": layer.mlp.down_proj.weight,
        }
        gemms = [
            _gemm_report(api, _REPORT_NAMES[g.proj], g, weights[g.proj])
            for g in layer_gemms(fam, act)
        ]
        route = _route(gemms, uncovered, grouped=grouped_form is not False)
        plan = _Plan(
            family=fam,
            act=act,
            eps_in=_eps(layer.input_layernorm),
            eps_mlp=_eps(mlp_norm),
            split=tuple(_proj_rows(attn, fam)) if not fam.fused_modules else _phi3_split(attn),
            rotary=mod.apply_rotary_pos_emb,
            eager_attention=mod.eager_attention_forward,
            attention_functions=mod.ALL_ATTENTION_FUNCTIONS,
            ops=ops,
            api=api,
            route=route,
            rope=rope,
            grouped_decode=grouped_form,
        )
        layer.register_buffer("_cudal2_w_qkv", w_qkv, persistent=False)
        layer.register_buffer("_cudal2_b_qkv", b_qkv, persistent=False)
        layer.register_buffer("_cudal2_w_gate_up", w_gu, persistent=False)
        for t in (w_qkv, b_qkv, w_gu):
            if t is not None:
                add(t.device, _nbytes(t))
        entry = _Patched(f"{prefix}.{i}", layer, type(layer), gemms, route)
        if originals != "keep":
            heads = () if rope is None else rope.heads
            unfolders = _unfolders(fam, layer, replaced, heads) if originals == "drop" else None
            for j, w in enumerate(replaced):
                move(w, None if unfolders is None else unfolders[j], entry.moved)
        layer._cudal2 = plan
        layer.__class__ = _fused_class(type(layer))
        done.append(entry)
    head_patch: Any = None
    head_report = None
    if lm_head is not None and final_norm is None:
        head_report = _gemm_report(api, "lm_head", HEADS["linear"], lm_head.weight)
        head_patch = patch_linear(lm_head, api, namespace)
    elif lm_head is not None:
        off = fam.norm_offset
        with torch.no_grad():
            w_head = fused.fold_rmsnorm(lm_head.weight, final_norm.weight, off)
        head_report = _gemm_report(api, "lm_head", HEADS["rmsnorm"], w_head)
        hplan = _HeadPlan(
            norm=final_norm,
            norm_cls=type(final_norm),
            eps=_eps(final_norm),
            ops=ops,
            api=api,
            route=_route([head_report], uncovered),
        )
        head_patch = _Head(lm_head, type(lm_head), hplan)
        lm_head.register_buffer("_cudal2_w_head", w_head, persistent=False)
        add(w_head.device, _nbytes(w_head))
        if originals != "keep" and not tied:  # a tied weight is the embedding's: it stays
            g = final_norm.weight

            def unfold(w: Any = w_head, g: Any = g) -> Any:
                return (w.float() / (g.float() + off)).to(w.dtype)

            move(lm_head.weight, unfold, head_patch.moved)
        lm_head._cudal2 = hplan
        lm_head.__class__ = _fused_class(type(lm_head), _head_forward)
        final_norm.__class__ = _fused_class(type(final_norm), _passthrough)
    return ModelPatch(done, head_patch, head_report, originals, added)


def _final_norm(mt: str, model: Any) -> Any:
    """The base model's final RMSNorm, which the LM head folds (refused if it has none)."""
    norm = getattr(getattr(model, "model", None), "norm", None)
    if norm is None or not type(norm).__name__.endswith("RMSNorm"):
        raise _refuse(
            mt,
            f"model.norm is {type(norm).__name__}, not an RMSNorm: the LM head cannot fold "
            "it (head='linear' keeps the head as it is)",
        )
    if hasattr(type(norm), "_cudal2_original"):
        raise _refuse(mt, "model.norm is already patched (restore() the earlier patch first)")
    return norm


def _tied(model: Any, lm_head: Any) -> bool:
    """Whether the LM head's weight is the input embedding's (tie_word_embeddings)."""
    get = getattr(model, "get_input_embeddings", None)
    emb = get() if get is not None else None
    return emb is not None and getattr(emb, "weight", None) is lm_head.weight


def _phi3_split(attn: Any) -> tuple[int, int, int]:
    c, d = attn.config, attn.head_dim
    return (c.num_attention_heads * d, c.num_key_value_heads * d, c.num_key_value_heads * d)
