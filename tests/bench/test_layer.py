"""The layer benchmark's math on the CPU (float32, no graphs, no compile): the vendor
layer, the cudal2 layer (a fake package: ``linear`` = ``F.linear``, and fused ops
written in torch) and the fp32 reference agree; packing, attention and RoPE are
checked against independent implementations (a naive loop, transformers' Llama)."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import types
from collections import Counter

import pytest
import torch
import torch.nn.functional as F

from cudal2.bench import layer as L

SMALL = [  # (hidden, heads, kv_heads, head_dim, intermediate): GQA groups 4, 1 (MHA), 8
    (256, 8, 2, 32, 384),
    (192, 3, 3, 64, 320),
    (512, 8, 1, 64, 256),
]


def small_shape(hidden: int, heads: int, kv: int, d: int, inter: int) -> L.LayerShape:
    return dataclasses.replace(
        L.layer_shape("llama-3.1-8b"),
        hidden=hidden,
        heads=heads,
        kv_heads=kv,
        head_dim=d,
        intermediate=inter,
    )


def inputs(shape: L.LayerShape, m: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    return (
        L.make_weights(shape, torch.float32, "cpu", gen),
        L.make_state(shape, m, torch.float32, "cpu", gen),
    )


class FakeStats:
    """The package's ``stats`` as the runtime's: hits per entry, fallbacks per reason."""

    def __init__(self) -> None:
        self.hits, self.fallbacks = Counter(), Counter()

    def reset(self) -> None:
        self.hits.clear()
        self.fallbacks.clear()

    def as_dict(self):
        return {"hits": dict(self.hits), "fallbacks": dict(self.fallbacks)}


def fake_package(fused: tuple[str, ...] = (), log: list | None = None) -> types.SimpleNamespace:
    """A cudal2 package's surface with torch inside: ``linear`` counts a hit on entry
    ``e/linear``; the fused ops named in ``fused`` exist, with their packers: CPU
    stand-ins of the runtime's (the spec's semantics: gate and up rows interleaved in
    pairs, the norm weight folded per column, the row scale rsqrt(mean(h²) + eps)).
    Each call is appended to ``log`` where given."""
    stats = FakeStats()

    def hit(op):
        def call(*args):
            stats.hits[f"e/{op.__name__}"] += 1
            if log is not None:
                log.append(op.__name__)
            return op(*args)

        return call

    def linear(x, w):
        return F.linear(x, w)

    def linear_residual(x, w, r):
        return F.linear(x, w) + r

    def pack_gate_up(gate, up):
        i, k = gate.shape
        return torch.stack((gate, up), 1).reshape(2 * i, k)

    def scaled(x, eps):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)

    def linear_gated(x, w, act, eps=None):
        if act not in ("silu", "gelu_tanh"):
            raise ValueError(f"unknown activation {act!r}")
        y = F.linear(x if eps is None else scaled(x, eps), w)
        g, u = y.unflatten(-1, (-1, 2)).unbind(-1)
        return (F.silu(g) if act == "silu" else F.gelu(g, approximate="tanh")) * u

    def fold_rmsnorm(w, norm_weight, offset=0.0):
        return (w.float() * (norm_weight.float() + offset)).to(w.dtype)

    def linear_rmsnorm(h, w, eps, bias=None):
        return F.linear(scaled(h, eps), w, bias)

    pkg = types.SimpleNamespace(linear=hit(linear), stats=stats, warmup=lambda: 0)
    if "residual" in fused:
        pkg.linear_residual = hit(linear_residual)
    if "gated" in fused:
        pkg.linear_gated, pkg.pack_gate_up = hit(linear_gated), pack_gate_up
    if "rmsnorm" in fused:
        pkg.linear_rmsnorm, pkg.fold_rmsnorm = hit(linear_rmsnorm), fold_rmsnorm
    return pkg


def close(a, b, rel=1e-5):
    return (a - b).abs().max().item() <= rel * b.abs().max().item()


@pytest.mark.parametrize("dims", SMALL)
@pytest.mark.parametrize("m", [1, 5])
def test_vendor_and_cudal2_layers_equal_the_fp32_reference(dims, m):
    shape = small_shape(*dims)
    w, s = inputs(shape, m)
    ref = L.reference(shape, w, s)
    pieces = L.Pieces.make(compiled=False)
    vendor = L.VendorLayer(shape, w, pieces)(s)
    own = L.Cudal2Layer(shape, w, pieces, fake_package())(s)
    assert close(vendor, ref) and close(own, ref)
    assert ref.abs().max().item() > 0.5  # activations of unit size, not vanishing


FUSIONS = tuple(L.FUSIONS)
FUSED = [c for r in range(4) for c in itertools.combinations(FUSIONS, r)]


@pytest.mark.parametrize("fused", FUSED, ids=lambda c: "+".join(c) or "none")
def test_every_set_of_fused_ops_gives_the_reference_layer(fused):
    shape = small_shape(*SMALL[0])
    w, s = inputs(shape, 3)
    pkg = fake_package(fused)
    layer = L.Cudal2Layer(shape, w, L.Pieces.make(compiled=False), pkg)
    layer.probe = {}
    assert close(layer(s), L.reference(shape, w, s))
    want = L.plan({f: f in fused for f in FUSIONS})
    assert layer.plan == want
    ops = {g: p["op"] for g, p in layer.probe.items()}
    assert ops == {g: L.PLAN_OPS[how] for g, how in want.items()}
    assert all(sum(p["hits"].values()) == 1 for p in layer.probe.values())


# (the fused ops the package has) -> the plan: qkv, o_proj, gate_up, down
PLANS = [
    ((), ("none", "none", "none", "none")),
    (("residual",), ("none", "residual", "none", "residual")),
    (("gated",), ("none", "none", "gated", "none")),
    (("rmsnorm",), ("rmsnorm", "none", "rmsnorm", "none")),
    (("residual", "gated"), ("none", "residual", "gated", "residual")),
    (("residual", "rmsnorm"), ("rmsnorm", "residual", "rmsnorm", "residual")),
    (("gated", "rmsnorm"), ("rmsnorm", "none", "rmsnorm_gated", "none")),
    (("residual", "gated", "rmsnorm"), ("rmsnorm", "residual", "rmsnorm_gated", "residual")),
]  # fmt: skip


@pytest.mark.parametrize(("fused", "want"), PLANS, ids=lambda c: "+".join(c) or "none")
def test_the_plan_of_each_set_of_fused_ops(fused, want):
    """gate_up prefers the gated op with the post-attention norm folded, then the gated
    op, then the folded norm; qkv folds the input norm; o_proj and down add the
    residual. Every row's layer gives the reference."""
    assert tuple(L.plan({f: f in fused for f in FUSIONS}).values()) == want
    shape = small_shape(*SMALL[1])
    w, s = inputs(shape, 2, seed=3)
    layer = L.Cudal2Layer(shape, w, L.Pieces.make(compiled=False), fake_package(fused))
    assert tuple(layer.plan.values()) == want
    assert close(layer(s), L.reference(shape, w, s))


def test_with_every_fused_op_o_proj_gate_up_and_down_run_back_to_back():
    """No kernel between the attention's output and the layer's: o_proj adds the
    residual, gate_up normalises its input and gates, down adds the residual."""
    log: list[str] = []

    def logged(name, fn):
        def call(*args):
            log.append(name)
            return fn(*args)

        return call

    pieces = L.Pieces.make(compiled=False)
    pieces = L.Pieces(**{n: logged(n, f) for n, f in vars(pieces).items()})
    shape = small_shape(*SMALL[0])
    w, s = inputs(shape, 3)
    pkg = fake_package(FUSIONS, log)
    layer = L.Cudal2Layer(shape, w, pieces, pkg)
    assert close(layer(s), L.reference(shape, w, s))
    assert log == ["linear_rmsnorm", "rope_split", "linear_residual", "linear_gated",
                   "linear_residual"]  # fmt: skip
    # gate_up's weight was packed and folded once, at construction
    want = pkg.fold_rmsnorm(pkg.pack_gate_up(w.gate, w.up), w.post_norm)
    assert torch.equal(layer.w_gu, want)


def test_the_plan_prefers_the_gated_op_for_gate_up_and_folds_the_norm_into_qkv():
    everything = {f: True for f in L.FUSIONS}
    assert L.plan(everything) == {
        "qkv": "rmsnorm",
        "o_proj": "residual",
        "gate_up": "rmsnorm_gated",
        "down": "residual",
    }
    assert L.plan({**everything, "rmsnorm": False})["gate_up"] == "gated"
    assert L.plan({**everything, "gated": False})["gate_up"] == "rmsnorm"
    assert set(L.plan({f: False for f in L.FUSIONS}).values()) == {"none"}
    # a fused op without its packer is not a capability
    half = types.SimpleNamespace(linear_gated=1, linear_rmsnorm=1, linear_residual=1)
    assert L.fusions(half) == {"residual": True, "gated": False, "rmsnorm": False}


def test_the_gated_op_gets_the_packages_own_packing():
    """A layer that packed gate_up itself (gate rows, then up rows) would hand the
    fake gated op a weight it reads wrongly: the packer's layout must reach it."""
    shape = small_shape(*SMALL[0])
    w, s = inputs(shape, 2)
    pkg = fake_package(("gated",))
    layer = L.Cudal2Layer(shape, w, L.Pieces.make(compiled=False), pkg)
    ref = L.reference(shape, w, s)
    assert close(layer(s), ref)
    layer.w_gu = w.gate_up()  # the vendor's packing, not the package's
    assert not close(layer(s), ref, rel=1e-2)


def test_packed_weights_are_q_k_v_and_gate_up_stacked_by_rows():
    shape = small_shape(*SMALL[0])
    w, s = inputs(shape, 4)
    h = s.x
    q, k, v = F.linear(h, w.qkv()).split([w.q.shape[0], w.k.shape[0], w.v.shape[0]], dim=-1)
    assert torch.equal(q, F.linear(h, w.q)) and torch.equal(v, F.linear(h, w.v))
    assert torch.equal(k, F.linear(h, w.k))
    gu = F.linear(h, w.gate_up())
    want = F.silu(F.linear(h, w.gate)) * F.linear(h, w.up)
    assert torch.allclose(L.silu_mul(gu), want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(("heads", "kv"), [(8, 2), (4, 4), (8, 1)])
def test_kv_cache_attention_equals_a_naive_loop(heads, kv):
    m, d, t = 3, 16, L.CACHE_TOKENS
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(m, n, d, generator=gen) for n in (heads, kv, kv))
    kc, vc = (torch.randn(m, kv, t, d, generator=gen) for _ in range(2))
    before = kc[:, :, :-1].clone()
    got = L.attention(q, k, v, kc, vc)
    assert torch.equal(kc[:, :, -1], k) and torch.equal(vc[:, :, -1], v)  # the new slot
    assert torch.equal(kc[:, :, :-1], before)  # the past untouched
    want = torch.empty(m, heads, d)
    for i, h in itertools.product(range(m), range(heads)):
        j = h // (heads // kv)  # the kv head this query head shares
        p = torch.softmax(kc[i, j] @ q[i, h] / math.sqrt(d), dim=0)
        want[i, h] = p @ vc[i, j]
    assert torch.allclose(got, want.reshape(m, -1), atol=1e-5)


@pytest.mark.parametrize("model", list(L.MODELS))
@pytest.mark.parametrize("position", [0, 1, 1023, 70000])
def test_rope_equals_transformers_llama(model, position):
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import (
        LlamaRotaryEmbedding,
        apply_rotary_pos_emb,
    )

    config_name, overrides, _ = L.MODELS[model]
    cfg = LlamaConfig(**{**json.loads((L.CONFIGS / config_name / "config.json").read_text()),
                         **overrides})  # fmt: skip
    shape = L.layer_shape(model)
    x = torch.zeros(1, 1, shape.head_dim)
    rotary = LlamaRotaryEmbedding(cfg)
    assert torch.allclose(L.inv_freq(shape), rotary.inv_freq, rtol=1e-6, atol=0)
    cos_t, sin_t = rotary(x, torch.tensor([[position]]))
    cos, sin = L.rope_cos_sin(shape, position)
    # fp32 angles: position x frequency carries the frequencies' 1e-6 relative difference
    tol = 1e-5 + 1e-6 * position
    assert torch.allclose(cos, cos_t[0, 0], atol=tol) and torch.allclose(sin, sin_t[0, 0], atol=tol)
    gen = torch.Generator().manual_seed(2)
    h, kv = shape.heads, shape.kv_heads
    qkv = torch.randn(3, (h + 2 * kv) * shape.head_dim, generator=gen)
    # the rotation itself, on transformers' angles
    q, k, v = L.rope_split(qkv, cos_t[0, 0], sin_t[0, 0], h, kv)
    parts = qkv.view(3, h + 2 * kv, -1).split([h, kv, kv], dim=1)
    q_t, k_t = apply_rotary_pos_emb(parts[0], parts[1], cos_t[0], sin_t[0], unsqueeze_dim=0)
    assert torch.allclose(q, q_t, atol=1e-4) and torch.allclose(k, k_t, atol=1e-4)
    assert torch.equal(v, parts[2])


def test_the_model_shapes_are_the_published_ones_per_gpu():
    s8 = L.layer_shape("llama-3.1-8b")
    assert s8.gemms() == {
        "qkv": (6144, 4096),
        "o_proj": (4096, 4096),
        "gate_up": (28672, 4096),
        "down": (4096, 14336),
    }
    s70 = L.layer_shape("llama-3.1-70b-tp8")
    assert (s70.tp, s70.hidden, s70.heads, s70.kv_heads, s70.intermediate) == (8, 8192, 8, 1, 3584)
    assert s70.gemms() == {  # o_proj and down see K / 8
        "qkv": (1280, 8192),
        "o_proj": (8192, 1024),
        "gate_up": (7168, 8192),
        "down": (8192, 3584),
    }
    with pytest.raises(KeyError, match="unknown model 'llama-2'.*llama-3.1-8b"):
        L.layer_shape("llama-2")


def test_the_llm_public_manifest_covers_every_gemm_of_both_layers():
    """The wheel ci/gpu_layer.sh carries (llm-public-h100) has a target for each GEMM
    the layers run, at each M and dtype they run it."""
    from cudal2.manifest import load_manifest

    targets = {
        (t.dtype, t.m, t.n, t.k)
        for t in load_manifest(L.CONFIGS.parent / "llm-public-h100.toml").targets
        if t.layout == "tn"
    }
    for model in L.MODELS:
        for n, k in L.layer_shape(model).gemms().values():
            for dtype, m in itertools.product(("fp16", "bf16"), (1, 16, 64)):
                assert (dtype, m, n, k) in targets, (model, dtype, m, n, k)


# The epilogue of the target each fused op of the full plan dispatches to (the package's
# op picks it: linear_gated with eps -> rmsnorm_<act>; linear_rmsnorm -> rmsnorm).
PLAN_EPILOGUES = {"rmsnorm": "rmsnorm", "residual": "residual", "rmsnorm_gated": "rmsnorm_silu"}


def test_the_layer_epilogues_manifest_covers_every_gemm_plain_and_fused():
    """bench/manifests/layer-epilogues-h100.toml (the wheel of the fused layer) has, for
    each GEMM both layers run, at each M and dtype: a plain target and one with the
    epilogue the full plan calls it with; and nothing else."""
    from cudal2.manifest import load_manifest

    path = L.CONFIGS.parents[1] / "bench" / "manifests" / "layer-epilogues-h100.toml"
    got = {
        (t.dtype, t.m, t.n, t.k, t.epilogue)
        for t in load_manifest(path).targets
        if t.layout == "tn"
    }
    full = L.plan({f: True for f in L.FUSIONS})
    want = set()
    for model in L.MODELS:
        for gemm, (n, k) in L.layer_shape(model).gemms().items():
            for dtype, m in itertools.product(("fp16", "bf16"), (1, 16, 64)):
                want |= {(dtype, m, n, k, "none"), (dtype, m, n, k, PLAN_EPILOGUES[full[gemm]])}
    assert got == want


def test_the_runtimes_packers_and_unfused_ops_give_the_reference_layer():
    """The stand-ins above against the runtime's own (``packaging/runtime/fused.py``:
    the packers and torch's unfused ops, what ``linear_gated`` / ``linear_rmsnorm``
    run where the table has no kernel): same packing, same layer."""
    from cudal2.packaging.runtime import fused

    shape = small_shape(*SMALL[2])
    w, s = inputs(shape, 3, seed=4)
    mine = fake_package(FUSIONS)
    assert torch.equal(fused.pack_gate_up(w.gate, w.up), mine.pack_gate_up(w.gate, w.up))
    assert torch.equal(
        fused.fold_rmsnorm(w.qkv(), w.in_norm), mine.fold_rmsnorm(w.qkv(), w.in_norm)
    )
    real = types.SimpleNamespace(
        linear=F.linear,
        linear_residual=lambda x, w, r: F.linear(x, w) + r,
        linear_gated=fused.unfused_gated,
        pack_gate_up=fused.pack_gate_up,
        linear_rmsnorm=fused.unfused_rmsnorm,
        fold_rmsnorm=fused.fold_rmsnorm,
    )
    layer = L.Cudal2Layer(shape, w, L.Pieces.make(compiled=False), real)
    assert layer.plan["gate_up"] == "rmsnorm_gated"
    assert close(layer(s), L.reference(shape, w, s))
