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
stays torch's). The LM head runs through ``linear`` (``ops.patch_linear`` on that one
module: it is patched where the table covers it). Rotary, the cache update and attention
are the family's own functions (its module's ``apply_rotary_pos_emb``, transformers'
``ALL_ATTENTION_FUNCTIONS`` with the model's ``_attn_implementation``, eager as the
default), with the arguments the family's attention passes them, so sdpa / eager /
flash and static or dynamic caches behave as in the unpatched model.

Where the table has no kernel for a GEMM, its op falls back to torch's unfused math; the
patch's ``report()`` says per layer which GEMMs have a table entry and which fall back.
Inference only (``model.eval()``). What it does not know it refuses before touching the
model (``PatchModelError``, naming the model type / config key and value).

Memory: the folded qkv and gate_up weights are new tensors (the norm weight is folded in,
so they cannot alias the originals); o_proj, down_proj and the LM head are used as they
are. ``originals`` decides what happens to the replaced weights (q/k/v/gate/up, or Phi-3's
qkv_proj/gate_up_proj): ``"keep"`` (default: nothing moves, ``restore()`` is free and
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
from .api import dtype_name
from .ops import LinearPatch, patch_linear

ORIGINALS = ("keep", "cpu", "drop")
# The modeling code the fused forward matches (argument names, the cache's ``update``,
# ``ALL_ATTENTION_FUNCTIONS.get_interface``): transformers 5 (read from 5.23). transformers
# 4 passes ``past_key_value`` and the static cache wants ``cache_position``: refused.
MIN_TRANSFORMERS = (5, 0)
# transformers' hidden_act names of the gated activations the fused ops compute exactly
# (ACT2FN: "silu" / "swish" are F.silu, "gelu_pytorch_tanh" is F.gelu(approximate="tanh")).
ACTS = {"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh"}
# Buffers the patch registers on a layer (non-persistent: not in state_dict).
_BUFFERS = ("_cudal2_w_qkv", "_cudal2_b_qkv", "_cudal2_w_gate_up")


@dataclass(frozen=True)
class Family:
    """What differs between the decoder families: the class-name prefix of their
    modules, the norms' ``(1 + w)`` offset, the config key of the activation, which
    modules are already fused (Phi-3), whether q/k/v carry a bias, whether the
    attention/MLP outputs are normalised before the residual add (Gemma-2), and the
    extra arguments their attention passes the attention function."""

    prefix: str
    norm_offset: float = 0.0
    act_key: str = "hidden_act"
    fused_modules: bool = False
    qkv_bias: bool = False
    post_norms: bool = False
    attn_kwargs: Any = None  # (attention module) -> dict


def _sliding_config(attn: Any) -> dict:
    return {"sliding_window": getattr(attn.config, "sliding_window", None)}


def _sliding_layer(attn: Any) -> dict:
    return {"sliding_window": attn.sliding_window}


def _gemma2_kwargs(attn: Any) -> dict:
    return {"sliding_window": attn.sliding_window, "softcap": attn.attn_logit_softcapping}


FAMILIES: dict[str, Family] = {
    "llama": Family("Llama"),
    "mistral": Family("Mistral", attn_kwargs=_sliding_config),
    "qwen2": Family("Qwen2", qkv_bias=True, attn_kwargs=_sliding_layer),
    "gemma": Family("Gemma", norm_offset=1.0),
    "phi3": Family("Phi3", fused_modules=True, attn_kwargs=_sliding_config),
    "gemma2": Family(
        "Gemma2",
        norm_offset=1.0,
        act_key="hidden_activation",
        post_norms=True,
        attn_kwargs=_gemma2_kwargs,
    ),
}
# Config keys whose True means a bias the family's fused forward does not carry.
_BIAS_KEYS = ("attention_bias", "mlp_bias")


class PatchModelError(ValueError):
    """A model (or a configuration of it) ``patch_model`` does not know; the message
    names the model type and the config key or module and its value."""


@dataclass(frozen=True)
class GemmReport:
    """One GEMM of a patched layer: the op that runs it, its epilogue and (N, K), and
    whether the table has an entry for (dtype, N, K, epilogue) (``entries``: GPU and M
    range of each; the call still checks the GPU and M) or the op falls back to torch's
    unfused math (``fallback``: why)."""

    gemm: str
    op: str
    epilogue: str
    n: int
    k: int
    dtype: str
    entries: tuple[str, ...]
    fallback: str | None

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
        }


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
    moved: list[_Moved] = field(default_factory=list)


class ModelPatch:
    """What ``patch_model`` did: ``report()`` (per layer, per GEMM: table entry or
    fallback), ``memory()`` (bytes added per device), ``restore()`` (also as a context
    manager)."""

    def __init__(
        self,
        layers: list[_Patched],
        head: LinearPatch | None,
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
        head = ["lm_head"] if self._head is not None and self._head.names else []
        return [p.name for p in self._layers] + head

    def report(self) -> dict:
        """Per decoder layer its GEMMs (``GemmReport.as_json``), and the LM head's."""
        return {
            "layers": {p.name: [g.as_json() for g in p.gemms] for p in self._layers},
            "lm_head": None if self._head_report is None else self._head_report.as_json(),
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
            for m in p.moved:  # before the packed buffers go: "drop" unfolds from them
                data = m.unfold() if m.unfold is not None else m.param.data
                m.param.data = data.to(m.device)
            if getattr(type(layer), "_cudal2_original", None) is p.cls:
                layer.__class__ = p.cls
            for name in _BUFFERS:
                layer._buffers.pop(name, None)
            layer.__dict__.pop("_cudal2", None)
        if self._head is not None:
            self._head.restore()
        self._layers, self._head, self._added = [], None, {}

    def __enter__(self) -> ModelPatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.restore()

    def __repr__(self) -> str:
        return f"ModelPatch({len(self._layers)} layers, originals={self.originals!r})"


# -- the fused forward ----------------------------------------------------------------

_torch: Any = None
_CLASSES: dict[type, type] = {}


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
    # Traced or recording autograd: the torch ops (the compiler sees them, CUDA graphs
    # capture them); plain inference: the Api's same dispatch without the dispatcher.
    ops = p.ops if torch.is_grad_enabled() or torch.compiler.is_compiling() else p.api
    attn = self.self_attn
    input_shape = hidden_states.shape[:-1]
    hidden_shape = (*input_shape, -1, attn.head_dim)
    qkv = ops.linear_rmsnorm(hidden_states, self._cudal2_w_qkv, p.eps_in, self._cudal2_b_qkv)
    q, k, v = qkv.split(p.split, dim=-1)
    q = q.view(hidden_shape).transpose(1, 2)
    k = k.view(hidden_shape).transpose(1, 2)
    v = v.view(hidden_shape).transpose(1, 2)
    cos, sin = position_embeddings
    q, k = p.rotary(q, k, cos, sin)
    # transformers >= 5.24 passes the cache as ``cache`` (``past_key_values`` before)
    cache = kwargs.pop("cache", None)
    cache = past_key_values if past_key_values is not None else cache
    if cache is not None:
        k, v = cache.update(k, v, attn.layer_idx)
    attention = p.attention_functions.get_interface(
        attn.config._attn_implementation, p.eager_attention
    )
    extra = p.family.attn_kwargs(attn) if p.family.attn_kwargs else {}
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


def _fused_class(cls: type) -> type:
    sub = _CLASSES.get(cls)
    if sub is None:
        sub = type(
            f"Cudal2Fused{cls.__name__}",
            (cls,),
            {"forward": _fused_forward, "_cudal2_original": cls},
        )
        _CLASSES[cls] = sub
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
    for key in _BIAS_KEYS:
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


def _gemm_report(api: Any, gemm: str, op: str, epilogue: str, w: Any) -> GemmReport:
    """Whether the table has an entry for this GEMM: the lookup the Api makes (a
    ``kernel`` entry for a fused epilogue, ``covers`` for a plain GEMM)."""
    n, k = w.shape
    dtype = dtype_name(w.dtype)
    if dtype is None:
        return GemmReport(gemm, op, epilogue, n, k, str(w.dtype), (), "dtype")
    entries = tuple(
        f"{e.gpu} M {e.m_min}-{e.m_max} {e.kind}"
        for e in api.table.entries
        if (e.dtype, e.layout, e.n, e.k, e.epilogue) == (dtype, "tn", n, k, epilogue)
    )
    fuses = api._fuses  # the fused op's own check: a kernel entry of that epilogue
    hit = api.covers(n, k, dtype) if epilogue == "none" else fuses(w.dtype, w, epilogue)
    return GemmReport(gemm, op, epilogue, n, k, dtype, entries, None if hit else "no_entry")


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


def _unfolders(fam: Family, layer: Any, originals: list[Any]) -> list[Any]:
    """For ``"drop"``: per original weight, a function recomputing it from the packed
    weights (norm weight divided out in fp32, rounded once)."""
    off = fam.norm_offset
    g_in = layer.input_layernorm.weight
    g_mlp = getattr(layer, _mlp_norm_name(fam)).weight

    def unfold(packed: Any, g: Any) -> Any:
        return (packed.float() / (g.float() + off)).to(packed.dtype)

    def qkv_rows(lo: int, hi: int) -> Any:
        return lambda: unfold(layer._cudal2_w_qkv[lo:hi], g_in)

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


def patch_model(model: Any, api: Any, namespace: str, originals: str = "keep") -> ModelPatch:
    """Run ``model`` (a transformers Llama, Mistral, Qwen2, Gemma, Phi-3 or Gemma-2
    decoder, ``*ForCausalLM`` or its base model, in eval mode) through the package's
    fused ops, layer by layer (module docstring). ``originals``: ``"keep"``, ``"cpu"``
    or ``"drop"`` (what happens to the weights the packed ones replace). Refuses what it
    does not know with ``PatchModelError`` before changing anything."""
    global _torch
    import torch

    _torch = torch
    if originals not in ORIGINALS:
        raise ValueError(
            f"patch_model: originals must be one of {list(ORIGINALS)}, got {originals!r}"
        )
    mt, fam, layers, head = _check_model(torch, model)
    for i, layer in enumerate(layers):
        _check_layer(torch, mt, fam, i, layer)
    if originals == "drop":
        folded = ("input_layernorm", _mlp_norm_name(fam))  # what "drop" divides out
        for i, layer in enumerate(layers):
            for n in folded:
                norm = getattr(layer, n)
                if bool((norm.weight.float() + fam.norm_offset == 0).any()):
                    raise _refuse(
                        mt,
                        f"layer {i}.{n} has a zero scale: originals='drop' could not "
                        "unfold it (use 'keep' or 'cpu')",
                    )
    ops = getattr(torch.ops, namespace)
    act = ACTS[getattr(model.config, fam.act_key)]
    prefix = "model.layers" if getattr(model, "model", None) is not None else "layers"
    added: dict[str, int] = {}

    def add(device: Any, n: int) -> None:
        key = str(device)
        added[key] = added.get(key, 0) + n

    done: list[_Patched] = []
    for i, layer in enumerate(layers):
        attn, mlp = layer.self_attn, layer.mlp
        mod = sys.modules[type(attn).__module__]
        w_qkv, b_qkv, w_gu, replaced = _pack(torch, fam, layer)
        mlp_norm = getattr(layer, _mlp_norm_name(fam))
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
        )
        gemms = [
            _gemm_report(
                api, "qkv", "linear_rmsnorm", "rmsnorm" if b_qkv is None else "rmsnorm_bias", w_qkv
            ),
        ]
        if fam.post_norms:
            gemms.append(_gemm_report(api, "o_proj", "linear", "none", attn.o_proj.weight))
        else:
            gemms.append(
                _gemm_report(api, "o_proj", "linear_residual", "residual", attn.o_proj.weight)
            )
        gemms.append(_gemm_report(api, "gate_up", "linear_gated", f"rmsnorm_{act}", w_gu))
        if fam.post_norms:
            gemms.append(_gemm_report(api, "down", "linear", "none", mlp.down_proj.weight))
        else:
            gemms.append(
                _gemm_report(api, "down", "linear_residual", "residual", mlp.down_proj.weight)
            )
        layer.register_buffer("_cudal2_w_qkv", w_qkv, persistent=False)
        layer.register_buffer("_cudal2_b_qkv", b_qkv, persistent=False)
        layer.register_buffer("_cudal2_w_gate_up", w_gu, persistent=False)
        for t in (w_qkv, b_qkv, w_gu):
            if t is not None:
                add(t.device, _nbytes(t))
        entry = _Patched(f"{prefix}.{i}", layer, type(layer), gemms)
        if originals != "keep":
            unfolders = _unfolders(fam, layer, replaced) if originals == "drop" else None
            for j, w in enumerate(replaced):
                add(w.device, -_nbytes(w))
                moved = _Moved(w, w.device, None if unfolders is None else unfolders[j])
                with torch.no_grad():
                    if originals == "cpu":
                        w.data = w.data.to("cpu")
                        add("cpu", _nbytes(w))
                    else:
                        w.data = w.data.new_empty((0,))
                entry.moved.append(moved)
        layer._cudal2 = plan
        layer.__class__ = _fused_class(type(layer))
        done.append(entry)
    head_patch, head_report = None, None
    if head is not None:
        head_report = _gemm_report(api, "lm_head", "linear", "none", head.weight)
        head_patch = patch_linear(head, api, namespace)
    return ModelPatch(done, head_patch, head_report, originals, added)


def _phi3_split(attn: Any) -> tuple[int, int, int]:
    c, d = attn.config, attn.head_dim
    return (c.num_attention_heads * d, c.num_key_value_heads * d, c.num_key_value_heads * d)
