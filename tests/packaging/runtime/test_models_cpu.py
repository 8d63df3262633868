"""``patch_model`` (issue 21) without a GPU: tiny random-weight transformers models of
each supported family, patched through a generated package (the recorded H100 table, whose
entries are for other shapes, so every fused op runs its torch fallback here, as on any
CPU), against the same model unpatched.

Tolerances. fp32: the fallbacks compute the same math as the model in another rounding
order (the norm weight multiplies the GEMM's weight instead of the activation; the
residual adds are the same adds), so the logits agree to ~1e-6 of their size; the bound is
1e-5 of the largest |logit|. fp16 / bf16: one rounding moved per folded norm (the product
``W * g`` is rounded instead of ``x * g``), so patched and unpatched differ by about as much
as either differs from the exact result; the bound is today's end-to-end rule (``TOLERANCE``
of bench/experiments/llama_e2e.py): the patched model's max |error| against an fp32 model
with the same weights is at most 2x the unpatched model's (measured here: 0.7-1.6x).
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
import re
import sys

import pytest
import torch
import transformers as T
from transformers.utils import logging as hf_logging

hf_logging.set_verbosity_error()

TOLERANCE = 2.0  # patched error vs fp32 at most this times the unpatched model's
# The recorded table has no entry for the tiny shapes, so by default (originals="keep")
# every call would run the layers' own forwards: the tests of the fused math ask for the
# fused forward whatever the table (its ops then run their torch fallbacks).
FUSED = dict(uncovered="fused")
FP32_REL = 1e-5
BASE = dict(
    vocab_size=97,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
    eos_token_id=None,
    bos_token_id=None,
    pad_token_id=0,
)
FAMILIES = {
    "llama": (T.LlamaConfig, T.LlamaForCausalLM, {}),
    "mistral": (T.MistralConfig, T.MistralForCausalLM, {}),
    "qwen2": (T.Qwen2Config, T.Qwen2ForCausalLM, {}),
    "gemma": (T.GemmaConfig, T.GemmaForCausalLM, {"head_dim": 16}),
    "phi3": (T.Phi3Config, T.Phi3ForCausalLM, {}),
    "gemma2": (T.Gemma2Config, T.Gemma2ForCausalLM, {"head_dim": 16}),
}


def tiny(family: str, dtype=torch.float32, seed: int = 0, **config):
    """A tiny ``family`` model in eval mode: random weights scaled up (x3, so the layers
    do more than pass the residual on), norm weights and biases randomised (transformers
    initialises them to 1 / 0 / zeros, which would hide a wrong fold or a lost bias)."""
    cfg_cls, model_cls, extra = FAMILIES[family]
    cfg = cfg_cls(**{**BASE, **extra, **config})
    torch.manual_seed(seed)
    model = model_cls(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or "bias" in name:
                p.add_(0.3 * torch.randn_like(p))
            else:
                p.mul_(3)
    return model.to(dtype)


def ids(seed: int = 0, batch: int = 2, tokens: int = 9):
    return torch.randint(
        1, BASE["vocab_size"], (batch, tokens), generator=torch.Generator().manual_seed(seed)
    )


def logits(model, x):
    with torch.no_grad():
        return model(x).logits.float()


def snapshot(model):
    """Every parameter and buffer (tensor, its storage address) and module class."""
    tensors = {
        n: (t.detach().clone(), t.data_ptr()) for n, t in model.state_dict(keep_vars=True).items()
    }
    classes = {n: type(m) for n, m in model.named_modules()}
    buffers = sorted(n for n, _ in model.named_buffers())
    return tensors, classes, buffers


def assert_same(model, snap, same_storage=True):
    tensors, classes, buffers = snap
    now = model.state_dict(keep_vars=True)
    assert sorted(now) == sorted(tensors)
    for name, (t, ptr) in tensors.items():
        assert now[name].dtype == t.dtype and now[name].device == t.device, name
        assert torch.equal(now[name].detach(), t), name
        if same_storage:
            assert now[name].data_ptr() == ptr, name
    assert {n: type(m) for n, m in model.named_modules()} == classes
    assert sorted(n for n, _ in model.named_buffers()) == buffers


@pytest.fixture
def pkg(package):
    return package


def rt(pkg):
    """The package's own copy of the runtime's models module (what its patch_model runs)."""
    return importlib.import_module(pkg.__name__ + "._runtime.models")


# -- correctness -----------------------------------------------------------------------


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_fp32_logits_match(pkg, family):
    model = tiny(family)
    x = ids()
    want = logits(model, x)
    with pkg.patch_model(model, **FUSED) as patch:
        got = logits(model, x)
        assert len(patch.report()["layers"]) == 2
        assert set(patch.report()["paths"]["model.layers.0"].values()) == {"fused_fallback"}
    assert (got - want).abs().max().item() <= FP32_REL * want.abs().max().item()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_half_logits_within_the_e2e_tolerance(pkg, family, dtype):
    model = tiny(family, dtype)
    ref = tiny(family)
    ref.load_state_dict({k: v.float() for k, v in model.state_dict().items()})
    x = ids(1)
    want = logits(ref, x)
    plain = logits(model, x)
    with pkg.patch_model(model, **FUSED):
        got = logits(model, x)
    err_plain = (plain - want).abs().max().item()
    err_patched = (got - want).abs().max().item()
    assert err_plain > 0  # the half model is not exact: the rule has a yardstick
    assert err_patched <= TOLERANCE * err_plain, (err_patched, err_plain)


def _close(model, pkg, x) -> bool:
    want = logits(model, x)
    with pkg.patch_model(model, **FUSED):
        got = logits(model, x)
    return (got - want).abs().max().item() <= FP32_REL * want.abs().max().item()


@pytest.mark.parametrize("family", ["gemma", "gemma2"])
def test_a_broken_fold_fails(pkg, family, monkeypatch):
    """The Gemma norms' (1 + w): without the offset the fold is wrong and the logits
    check catches it (the test above is able to fail)."""
    assert _close(tiny(family), pkg, ids())
    models = rt(pkg)
    broken = dataclasses.replace(models.FAMILIES[family], norm_offset=0.0)
    monkeypatch.setitem(models.FAMILIES, family, broken)
    assert not _close(tiny(family), pkg, ids())


def test_a_lost_qkv_bias_fails(pkg, monkeypatch):
    assert _close(tiny("qwen2"), pkg, ids())
    models = rt(pkg)
    real = models._pack

    def no_bias(torch_, fam, layer):
        w_qkv, _, w_gu, replaced = real(torch_, fam, layer)
        return w_qkv, None, w_gu, replaced

    monkeypatch.setattr(models, "_pack", no_bias)
    assert not _close(tiny("qwen2"), pkg, ids())


@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_generate_gives_the_same_tokens(pkg, family, cache):
    model = tiny(family)
    x = ids(2, batch=2, tokens=5)
    kw = dict(max_new_tokens=6, do_sample=False, min_new_tokens=6)
    if cache == "static":
        kw["cache_implementation"] = "static"
    with torch.no_grad():
        want = model.generate(x, **kw)
        with pkg.patch_model(model, **FUSED):
            got = model.generate(x, **kw)
    assert want.shape == (2, 11)
    assert torch.equal(got, want)


@pytest.mark.parametrize(("variant", "batch"), [("sdpa", 8), ("sdpa", 4), ("math", 2), (True, 1)])
@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_grouped_decode_generates_the_same_logits(pkg, family, cache, variant, batch, monkeypatch):
    """``grouped_decode``: each decode step's attention over the grouped KV heads in place
    (the tiny models: 4 query heads, 2 KV heads), the same tokens and, step by step, the
    logits within the fp32 bound; at one new token a sequence only, not for Gemma-2 (its
    soft cap). ``"sdpa"`` from ``GROUPED_MIN_KV_ROWS`` (16) (sequence, KV head) pairs
    (batch 8, not 4); ``"math"`` (two matmuls and a softmax; ``True``, the default, is it)
    at any batch."""
    model = tiny(family)
    x = ids(4, batch=batch, tokens=5)
    kw = dict(max_new_tokens=5, do_sample=False, min_new_tokens=5, output_logits=True)
    kw["return_dict_in_generate"] = True
    if cache == "static":
        kw["cache_implementation"] = "static"
    runtime = importlib.import_module(pkg.__name__ + "._runtime.models")
    calls = []
    name = "_grouped_decode_sdpa" if variant == "sdpa" else "_grouped_decode_math"
    real = getattr(runtime, name)
    monkeypatch.setattr(
        runtime, name, lambda torch, q, *a: calls.append(q.shape) or real(torch, q, *a)
    )
    with torch.no_grad():
        want = model.generate(x, **kw)
        with pkg.patch_model(model, grouped_decode=variant, **FUSED):
            got = model.generate(x, **kw)
    assert torch.equal(got.sequences, want.sequences)
    w, g = torch.stack(want.logits).float(), torch.stack(got.logits).float()
    assert (g - w).abs().max().item() <= FP32_REL * w.abs().max().item()
    layers = model.config.num_hidden_layers
    enough = variant != "sdpa" or batch * 2 >= runtime.GROUPED_MIN_KV_ROWS
    grouped = family != "gemma2" and enough
    assert calls == ([(batch, 4, 1, 16)] * (4 * layers) if grouped else []), calls[:3]


def test_grouped_decode_math_pairs_the_heads_as_repeat_kv(monkeypatch):
    """The math form's grouping against transformers' eager attention on the expanded
    heads (fp32): equal within rounding; pairing query head h with KV head h % kv (the
    other order) is not."""
    import transformers.integrations.sdpa_attention as sdpa

    from cudal2.packaging.runtime import models as runtime

    g = torch.Generator().manual_seed(0)
    b, heads, kv, d, n = 3, 8, 2, 16, 40
    q = torch.randn(b, heads, 1, d, generator=g)
    k, v = torch.randn(b, kv, n, d, generator=g), torch.randn(b, kv, n, d, generator=g)
    mask = torch.zeros(b, 1, 1, n, dtype=torch.bool)
    mask[..., :30] = True
    ref = torch.nn.functional.scaled_dot_product_attention(
        q, sdpa.repeat_kv(k, heads // kv), sdpa.repeat_kv(v, heads // kv), attn_mask=mask
    ).transpose(1, 2)
    for m in (mask, torch.zeros(b, 1, 1, n).masked_fill(~mask, float("-inf"))):
        got = runtime._grouped_decode_math(torch, q, k, v, m, d**-0.5)
        assert (got - ref).abs().max().item() < 1e-5
    swapped = q.reshape(b, heads // kv, kv, d).transpose(1, 2).reshape(b, heads, 1, d)
    other = runtime._grouped_decode_math(torch, swapped, k, v, mask, d**-0.5)
    assert (other - ref).abs().max().item() > 1e-2


@pytest.mark.parametrize(
    ("given", "batch", "want"),
    [
        ({}, 1, ["math"]),
        ({}, 8, ["math"]),
        ({"grouped_decode": "sdpa"}, 8, ["sdpa"]),
        ({"grouped_decode": "sdpa"}, 1, []),
        ({"grouped_decode": False}, 8, []),
    ],
)
def test_grouped_decode_is_on_by_default_and_off_with_false(pkg, monkeypatch, given, batch, want):
    """The default runs the grouped math form in each layer of the one decode step at
    any batch; ``"sdpa"`` the grouped SDPA call from 16 pairs (batch 8, not 1);
    ``False``: transformers' attention at every batch."""
    runtime = importlib.import_module(pkg.__name__ + "._runtime.models")
    calls = []
    for name in ("sdpa", "math"):
        real = getattr(runtime, f"_grouped_decode_{name}")
        monkeypatch.setattr(
            runtime, f"_grouped_decode_{name}", lambda *a, n=name, f=real: calls.append(n) or f(*a)
        )
    model = tiny("llama")
    kw = dict(max_new_tokens=2, do_sample=False, min_new_tokens=2)
    with torch.no_grad(), pkg.patch_model(model, **given, **FUSED):
        model.generate(ids(4, batch=batch, tokens=5), **kw)
    assert calls == want * model.config.num_hidden_layers


@pytest.mark.parametrize("value", ["yes", 1, 0, "MATH", None, "SDPA", 1.0])
def test_grouped_decode_must_be_true_false_math_or_sdpa(pkg, value):
    want = "must be one of [True, False, 'math', 'sdpa'], got "
    with pytest.raises(ValueError, match=re.escape(want + repr(value))):
        pkg.patch_model(tiny("llama"), grouped_decode=value)


def test_torch_compile_runs_the_ops(pkg):
    """Under torch.compile the forward calls the torch ops (fake impls trace them)."""
    model = tiny("llama")
    x = ids()
    want = logits(model, x)
    with pkg.patch_model(model, **FUSED):
        compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
        got = logits(compiled, x)
    assert (got - want).abs().max().item() <= FP32_REL * want.abs().max().item()


def test_base_model_and_eager_attention(pkg):
    """The base LlamaModel (no LM head) and attn_implementation="eager" both work."""
    model = tiny("llama", attn_implementation="eager")
    base = model.model
    x = ids()
    with torch.no_grad():
        want = base(x).last_hidden_state
        with pkg.patch_model(base, **FUSED) as patch:
            got = base(x).last_hidden_state
    assert patch.report()["lm_head"] is None
    assert (got - want).abs().max().item() <= FP32_REL * want.abs().max().item()


def test_training_forward_refused_while_patched(pkg):
    model = tiny("llama")
    with pkg.patch_model(model):
        model.train()
        with pytest.raises(RuntimeError, match="patched for inference"):
            model(ids())


# -- restore and memory ------------------------------------------------------------------


@pytest.mark.parametrize("originals", ["keep", "cpu"])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_restore_is_bit_exact(pkg, family, originals):
    model = tiny(family, torch.bfloat16)
    x = ids()
    before = logits(model, x)
    snap = snapshot(model)
    patch = pkg.patch_model(model, originals=originals)
    assert type(model.model.layers[0]).__name__.startswith("Cudal2Fused")
    assert sorted(model.state_dict()) == sorted(snap[0])  # the packed buffers are not state
    patch.restore()
    assert_same(model, snap)
    assert torch.equal(logits(model, x), before)
    assert patch.names == [] and patch.memory() == {}


@pytest.mark.parametrize("family", ["llama", "gemma", "phi3"])
def test_drop_frees_and_unfolds(pkg, family):
    """Separate q/k/v and gate/up, Gemma's (1 + w) and Phi-3's stacked modules each
    unfold back into their own layout."""
    model = tiny(family, torch.bfloat16)
    snap = snapshot(model)
    attn = model.model.layers[0].self_attn
    q = attn.qkv_proj.weight if family == "phi3" else attn.q_proj.weight
    tied = model.lm_head.weight is model.model.embed_tokens.weight  # Gemma ties them
    patch = pkg.patch_model(model, originals="drop")
    assert q.numel() == 0
    # the packed weights take the originals' bytes; a tied head's weight is the
    # embedding's and stays, so its folded copy is added
    head = model.lm_head.weight.numel() * 2 if tied else 0
    assert (family == "gemma") == tied
    assert patch.memory() == {"cpu": head}
    patch.restore()
    tensors, classes, _ = snap
    now = model.state_dict()
    for name, (t, _) in tensors.items():
        # one rounding: w * g rounded, divided by g in fp32, rounded again
        assert torch.allclose(now[name].float(), t.float(), rtol=2**-7, atol=0), name
    assert {n: type(m) for n, m in model.named_modules()} == classes


@pytest.mark.parametrize("family", ["llama", "qwen2", "phi3"])
def test_memory_is_the_packed_weights(pkg, family):
    model = tiny(family, torch.float16)
    c = model.config
    d = c.hidden_size // c.num_attention_heads
    qkv = (c.num_attention_heads + 2 * c.num_key_value_heads) * d * c.hidden_size
    gate_up = 2 * c.intermediate_size * c.hidden_size
    bias = (c.num_attention_heads + 2 * c.num_key_value_heads) * d if family == "qwen2" else 0
    packed = c.num_hidden_layers * 2 * (qkv + gate_up + bias)
    head = 2 * c.vocab_size * c.hidden_size  # the LM head with the final norm folded in
    assert not c.tie_word_embeddings
    with pkg.patch_model(model) as patch:
        assert patch.memory() == {"cpu": packed + head}
    with pkg.patch_model(model, head="linear") as patch:  # no folded head: no bytes
        assert patch.memory() == {"cpu": packed}
    with pkg.patch_model(model, originals="cpu") as patch:  # off the CPU, onto the CPU
        assert patch.memory() == {"cpu": packed + head}
    with pkg.patch_model(model, originals="drop") as patch:
        assert patch.memory() == {"cpu": packed - c.num_hidden_layers * 2 * (qkv + gate_up)}


# -- the report ------------------------------------------------------------------------


def test_report_names_every_gemm_and_its_fallback(pkg):
    model = tiny("qwen2", torch.float16)
    with pkg.patch_model(model) as patch:
        rep = patch.report()
    assert sorted(rep["layers"]) == ["model.layers.0", "model.layers.1"]
    rows = rep["layers"]["model.layers.0"]
    assert [(r["gemm"], r["op"], r["epilogue"], r["n"], r["k"]) for r in rows] == [
        ("qkv", "linear_rmsnorm", "rmsnorm_bias", 128, 64),
        ("o_proj", "linear_residual", "residual", 64, 64),
        ("gate_up", "linear_gated", "rmsnorm_silu", 192, 64),
        ("down", "linear_residual", "residual", 64, 96),
    ]
    # the recorded table has no entry for these shapes: every GEMM falls back
    assert {r["fallback"] for r in rows} == {"no_entry"} and all(not r["entries"] for r in rows)
    assert rep["lm_head"]["fallback"] == "no_entry" and rep["lm_head"]["n"] == 97
    gemma2 = tiny("gemma2", torch.bfloat16)
    with pkg.patch_model(gemma2) as patch:
        rows = patch.report()["layers"]["model.layers.0"]
    assert [(r["gemm"], r["op"], r["epilogue"]) for r in rows] == [
        ("qkv", "linear_rmsnorm", "rmsnorm"),
        ("o_proj", "linear", "none"),
        ("gate_up", "linear_gated", "rmsnorm_gelu_tanh"),
        ("down", "linear", "none"),
    ]


@pytest.fixture
def table_package(tmp_path, monkeypatch, recorded_table, recorded_cubins, write_package):
    """A factory: the recorded table plus SYNTHETIC entries (a plumbing fixture, not
    figures: the smallest fp16 kernel entry copied), each (n, k, epilogue, m_max): an
    entry measured at M = m_max, so the table covers M 1..m_max of that GEMM."""
    e = min(
        (
            x
            for x in recorded_table.entries
            if x.layout == "tn" and x.dtype == "fp16" and x.kind == "kernel"
        ),
        key=lambda x: x.n * x.k,
    )

    def entry(n, k, epilogue, m_max, dtype="fp16", kind="kernel"):
        launch = dict(e.launch)
        if epilogue != "none":
            boxes = {"a": [64, launch["tile_m"]], "b": [64, launch["tile_n"]]}
            launch |= {"abi": "gemm_v3", "epilogue": epilogue, "tma": boxes}
        if kind == "fallback":  # the build found the baseline (torch's ops) best here
            nothing = dict.fromkeys(("kernel", "symbol", "cubin_sha256", "launch", "design_key"))
            return dataclasses.replace(
                e, **nothing, kind=kind, n=n, k=k, epilogue=epilogue, m_min=1,
                m_max=m_max, m_measured=m_max, dtype=dtype, speedup=1.0,
                time_us=e.baseline_us or e.time_us,
            )  # fmt: skip
        return dataclasses.replace(
            e,
            n=n,
            k=k,
            launch=launch,
            epilogue=epilogue,
            m_min=1,
            m_max=m_max,
            m_measured=m_max,
            dtype=dtype,
        )

    names = []

    def make(specs):
        extra = tuple(entry(*spec) for spec in specs)
        table = dataclasses.replace(recorded_table, entries=(*recorded_table.entries, *extra))
        name = write_package(tmp_path, table, recorded_cubins)
        names.append(name)
        return importlib.import_module(name)

    monkeypatch.syspath_prepend(str(tmp_path))
    yield make
    for name in names:
        for key in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
            del sys.modules[key]


@pytest.fixture
def tiny_table_package(table_package):
    """Entries for the tiny Llama's qkv (rmsnorm), o_proj (residual) and LM head (plain
    and with the final norm folded), so the report has entries to find; gate_up and
    down have none."""
    m = 64
    specs = [(128, 64, "rmsnorm", m), (64, 64, "residual", m), (97, 64, "none", m)]
    return table_package([*specs, (97, 64, "rmsnorm", m)])


def test_report_finds_the_table_entries(tiny_table_package):
    model = tiny("llama", torch.float16)
    with tiny_table_package.patch_model(model, head="linear") as patch:
        rep = patch.report()
        assert patch.names[-1] == "lm_head"  # covered: patch_linear routed it
    rows = {r["gemm"]: r for r in rep["layers"]["model.layers.1"]}
    assert rows["qkv"]["fallback"] is None and rows["qkv"]["entries"]
    assert rows["qkv"]["m_ranges"] == [[1, 64]]
    assert rows["o_proj"]["fallback"] is None
    assert rows["gate_up"]["fallback"] == rows["down"]["fallback"] == "no_entry"
    assert rows["gate_up"]["m_ranges"] == []
    assert rep["lm_head"]["fallback"] is None and rep["lm_head"]["epilogue"] == "none"
    assert type(model.lm_head) is torch.nn.Linear  # restored
    with tiny_table_package.patch_model(model) as patch:  # the folded head: rmsnorm
        rep = patch.report(ms=[1])
    assert rep["lm_head"]["op"] == "linear_rmsnorm" and rep["lm_head"]["fallback"] is None
    # gate_up and down have no entry: at every M the layers run their own forward
    assert rep["paths"] == {
        "model.layers.0": {"1": "original"},
        "model.layers.1": {"1": "original"},
        "lm_head": {"1": "fused"},
    }


# -- the path per M ----------------------------------------------------------------------

COVERED_M = 8  # the synthetic entries cover M 1..8 of every fused GEMM of the tiny models


def _tiny_specs(m_max=COVERED_M):
    """Every fused GEMM of the tiny models (hidden 64, intermediate 96, 4 heads of 16, 2
    KV heads, vocabulary 97), fp16 and bf16: qkv 128 x 64 (with and without bias), o 64
    x 64, gate_up 192 x 64 (silu and gelu_tanh), down 64 x 96, the folded LM head 97 x
    64. (An fp32 model has no entry at any M: the table's dtypes are fp16 / bf16.)"""
    gemms = [
        (128, 64, "rmsnorm"),
        (128, 64, "rmsnorm_bias"),
        (64, 64, "residual"),
        (192, 64, "rmsnorm_silu"),
        (192, 64, "rmsnorm_gelu_tanh"),
        (64, 96, "residual"),
        (97, 64, "rmsnorm"),
    ]
    return [(*g, m_max, dtype) for g in gemms for dtype in ("fp16", "bf16")]


@pytest.fixture
def m_package(table_package):
    return table_package(_tiny_specs())


# (dtype, originals, uncovered, M covered?) -> the path the layers take; where it is
# "original" the outputs are the unpatched model's bit for bit.
ROUTES = [
    ("bf16", "keep", None, True, "fused"),
    ("bf16", "keep", None, False, "original"),
    ("fp32", "keep", None, True, "original"),  # no fp32 entries: never fused
    ("fp32", "keep", None, False, "original"),
    ("bf16", "keep", "fused", False, "fused_fallback"),
    ("bf16", "keep", "fused", True, "fused"),
    ("fp32", "keep", "fused", False, "fused_fallback"),
    ("bf16", "cpu", None, False, "fused_fallback"),
    ("bf16", "cpu", None, True, "fused"),
    ("bf16", "drop", None, False, "fused_fallback"),
]
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


@pytest.mark.parametrize("row", ROUTES, ids=["-".join(map(str, r)) for r in ROUTES])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_path_per_m(m_package, family, row):
    dtype, originals, uncovered, covered, path = row
    model = tiny(family, DTYPES[dtype])
    ref = copy.deepcopy(model).float()  # the same values in fp32
    # M = batch x tokens rows: 2 x 3 = 6 is covered (<= 8); 2 x 9 = 18 is not
    x = ids(3, batch=2, tokens=3 if covered else 9)
    m = x.numel()
    exact = logits(ref, x)
    want = logits(model, x)
    kw = {} if uncovered is None else {"uncovered": uncovered}
    with m_package.patch_model(model, originals=originals, **kw) as patch:
        got = logits(model, x)
        rep = patch.report()
    layers = [n for n in rep["paths"] if n != "lm_head"]
    assert len(layers) == 2
    assert {n: rep["paths"][n] for n in layers} == {n: {str(m): path} for n in layers}
    # the head's M is the rows it is given (every row here): the same path
    assert rep["paths"]["lm_head"] == {str(m): path}
    if path == "original":
        assert torch.equal(got, want)  # the original modules' forward, bit for bit
        return
    # the fused math: not the same rounding (so the equality above can fail)
    assert not torch.equal(got, want)
    if dtype == "fp32":
        assert (got - want).abs().max().item() <= FP32_REL * want.abs().max().item()
    else:
        err_plain = (want - exact).abs().max().item()
        assert 0 < (got - exact).abs().max().item() <= TOLERANCE * err_plain


def test_a_gemm_without_an_entry_keeps_the_layer_original(table_package):
    """One fused GEMM of the layer uncovered (gate_up) at M: the whole layer runs its own
    forward; the head, covered, runs fused."""
    specs = [s for s in _tiny_specs() if s[2] != "rmsnorm_silu"]
    rep = _patched_within_tolerance(table_package(specs), torch.bfloat16, 2, [4, 9])
    assert rep["paths"]["model.layers.0"] == {"4": "original", "9": "original"}
    assert rep["paths"]["lm_head"] == {"4": "fused", "9": "original"}


def _patched_within_tolerance(pkg, dtype, tokens: int, ms: list[int]) -> dict:
    """A tiny Llama's logits of 2 x ``tokens`` ids patched by ``pkg``: within the
    tolerance rule of the unpatched model's (against fp32); the report at ``ms``."""
    model = tiny("llama", dtype)
    ref = copy.deepcopy(model).float()
    x = ids(4, batch=2, tokens=tokens)
    want = logits(model, x)
    with pkg.patch_model(model) as patch:
        got = logits(model, x)
        rep = patch.report(ms=ms)
    exact = logits(ref, x)
    assert (got - exact).abs().max().item() <= TOLERANCE * (want - exact).abs().max().item()
    return rep


# A prefill M past the row-scaled entries (M 12; they cover 1..8) where the twins
# serve (NORMED_TWINS): qkv's plain GEMM and gate_up's gated one cover M 1..64, as the
# residual GEMMs do. (the twins present, the path at M 12)
PREFILL_TWINS = [
    ((("none", 128), ("silu", 192)), "fused"),
    ((("silu", 192),), "original"),  # no plain qkv entry: nothing serves it at M 12
    ((("none", 128),), "original"),  # no silu entry: gate_up has nothing at M 12
]


@pytest.mark.parametrize(("twins", "path"), PREFILL_TWINS)
def test_a_prefill_m_takes_the_fused_forward_through_the_twins(table_package, twins, path):
    """sm90tma's persistent prefill kernels render the gated activation and the
    residual but never the row scale: at a prefill M a patched layer runs its fused
    forward where torch's RMSNorm and then the plain qkv / the gated gate_up kernel
    serve, and its own forward where either twin is missing."""
    row_scaled = [(128, 64, "rmsnorm", COVERED_M), (192, 64, "rmsnorm_silu", COVERED_M)]
    wide = [(64, 64, "residual"), (64, 96, "residual"), (97, 64, "rmsnorm")]
    wide += [(n, 64, name) for name, n in twins]
    pkg = table_package([*row_scaled, *((*w, 64) for w in wide)])
    rep = _patched_within_tolerance(pkg, torch.float16, 6, [4, 12])
    assert rep["paths"]["model.layers.0"] == {"4": "fused", "12": path}
    rows = {r["gemm"]: r for r in rep["layers"]["model.layers.0"]}
    if path == "fused":
        assert rows["qkv"]["m_ranges"] == rows["gate_up"]["m_ranges"] == [[1, 64]]


@pytest.mark.parametrize(
    ("grouped", "batch", "tokens", "path"),
    [
        (True, 3, 1, "fused"),  # a decode call: the fused forward, gate_up on torch's math
        (True, 2, 2, "original"),  # a prefill at a covered M: the layers' own forward
        (False, 3, 1, "original"),  # no grouped decode: the layers' own forward
    ],
)
def test_a_gemm_with_a_fallback_entry(table_package, grouped, batch, tokens, path):
    """gate_up's table entry at M is a fallback (the build measured torch's math best
    there): with grouped decode on, a decode call still runs the fused forward (gate_up
    on torch's unfused math, the rest on their kernels' entries, the grouped attention);
    a prefill, or a patch without grouped decode, runs the layers' own forward there
    (the paths are those the calls took); the report names the fallback entry."""
    specs = [s if s[2] != "rmsnorm_silu" else (*s, "fallback") for s in _tiny_specs()]
    pkg = table_package(specs)
    model = tiny("llama", torch.bfloat16)
    ref = copy.deepcopy(model).float()
    x = ids(4, batch=batch, tokens=tokens)
    want = logits(model, x)
    with pkg.patch_model(model, grouped_decode=grouped) as patch:
        got = logits(model, x)
        rep = patch.report()
    m = str(batch * tokens)
    assert rep["paths"]["model.layers.0"] == {m: path}
    rows = {r["gemm"]: r for r in rep["layers"]["model.layers.0"]}
    assert rows["gate_up"]["fallback"] == "fallback_entry" and rows["gate_up"]["m_ranges"] == []
    assert rows["qkv"]["fallback"] is None
    # (the LM head has its kernel entry here: fused either way, so no bitwise check)
    exact = logits(ref, x)
    assert (got - exact).abs().max().item() <= TOLERANCE * (want - exact).abs().max().item()


@pytest.mark.parametrize("family", ["llama", "qwen2", "gemma2"])
def test_generate_prefill_original_decode_fused(m_package, family):
    """A 2 x 5 prompt (M = 10: no entry, the layers' own forward) then decode steps at
    M = 2 (covered: fused): the same tokens as the unpatched model, and the report says
    which path each M took. fp16: in bf16 the fused rounding flips a near-tied token of
    the tiny Llama at the second step (its logits stay within the tolerance rule)."""
    model = tiny(family, torch.float16)
    x = ids(5, batch=2, tokens=5)
    kw = dict(max_new_tokens=4, do_sample=False, min_new_tokens=4)
    with torch.no_grad():
        want = model.generate(x, **kw)
        with m_package.patch_model(model) as patch:
            got = model.generate(x, **kw)
            rep = patch.report()
    assert torch.equal(got, want)
    assert rep["paths"]["model.layers.1"] == {"2": "fused", "10": "original"}
    assert rep["paths"]["lm_head"] == {"2": "fused"}  # logits_to_keep: the last row


@pytest.mark.parametrize("covered", [True, False])
def test_torch_compile_takes_the_path_of_its_m(m_package, covered):
    """Under torch.compile the path is chosen while tracing, from the static M (a
    constant of the graph: no graph break under fullgraph)."""
    model = tiny("llama", torch.bfloat16)
    x = ids(6, batch=2, tokens=3 if covered else 9)
    want = logits(model, x)
    exact = logits(copy.deepcopy(model).float(), x)
    with m_package.patch_model(model) as patch:
        compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
        got = logits(compiled, x)
        assert patch.report()["paths"]["model.layers.0"] == {}  # traced calls: not counted
    if covered:
        assert not torch.equal(got, want)
        assert (got - exact).abs().max().item() <= TOLERANCE * (want - exact).abs().max().item()
    else:
        assert torch.equal(got, want)


def test_bad_uncovered(pkg):
    with pytest.raises(ValueError, match="uncovered must be one of"):
        pkg.patch_model(tiny("llama"), uncovered="torch")
    with pytest.raises(ValueError, match="originals='drop' takes away"):
        pkg.patch_model(tiny("llama"), originals="drop", uncovered="original")
    with pytest.raises(ValueError, match="head must be one of"):
        pkg.patch_model(tiny("llama"), head="fold")


# -- the LM head -------------------------------------------------------------------------


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_folded_head(m_package, family):
    """The final norm folded into the head: its logits against the unpatched model's
    (fp32), the final norm passing its input on while patched, restored after."""
    model = tiny(family)
    x = ids(7, batch=2, tokens=3)
    want = logits(model, x)
    norm_cls, head_cls = type(model.model.norm), type(model.lm_head)
    with m_package.patch_model(model, uncovered="fused") as patch:
        assert type(model.model.norm).__name__.startswith("Cudal2Fused")
        got = logits(model, x)
        assert patch.names[-1] == "lm_head"
        assert patch.report()["lm_head"]["op"] == "linear_rmsnorm"
    assert (got - want).abs().max().item() <= FP32_REL * want.abs().max().item()
    assert (type(model.model.norm), type(model.lm_head)) == (norm_cls, head_cls)
    assert "_cudal2_w_head" not in dict(model.lm_head.named_buffers())
    assert torch.equal(logits(model, x), want)


def test_a_broken_head_fold_fails(m_package, monkeypatch):
    """Gemma's final norm (1 + w): the head's fold with the offset dropped is caught."""
    model = tiny("gemma")
    x = ids(7, batch=2, tokens=3)
    want = logits(model, x)
    models = rt(m_package)
    real = models.fused.fold_rmsnorm
    monkeypatch.setattr(
        models.fused,
        "fold_rmsnorm",
        lambda w, g, off=0.0: real(w, g, 0.0 if w.shape[0] == 97 else off),
    )
    with m_package.patch_model(model, uncovered="fused"):
        got = logits(model, x)
    assert (got - want).abs().max().item() > FP32_REL * want.abs().max().item()


@pytest.mark.parametrize("originals", ["cpu", "drop"])
def test_the_head_weight_moves_unless_tied(m_package, originals):
    llama, gemma = tiny("llama", torch.bfloat16), tiny("gemma", torch.bfloat16)
    for model, tied in ((llama, False), (gemma, True)):
        w = model.lm_head.weight
        before = w.detach().clone()
        with m_package.patch_model(model, originals=originals):
            if tied:  # the embedding's weight: it stays where it is
                assert w.numel() == before.numel()
            elif originals == "drop":
                assert w.numel() == 0
        if originals == "drop" and not tied:  # unfolded: one rounding
            assert torch.allclose(w.float(), before.float(), rtol=2**-7, atol=0)
        else:
            assert torch.equal(w, before)


def test_head_linear_leaves_the_norm(pkg):
    model = tiny("llama")
    with pkg.patch_model(model, head="linear", **FUSED) as patch:
        assert type(model.model.norm).__name__ == "LlamaRMSNorm"
        assert patch.report()["lm_head"]["op"] == "linear"
        assert "lm_head" not in patch.report()["paths"]


# -- refusals ----------------------------------------------------------------------------


class QuantLinear(torch.nn.Linear):
    """Stands in for a quantized linear module (bitsandbytes, GPTQ...)."""


def _set(obj, **attrs):
    for k, v in attrs.items():
        setattr(obj, k, v)


def _shard_q(m):
    attn = m.model.layers[1].self_attn
    attn.q_proj = torch.nn.Linear(64, 32, bias=False)


def _bias_on_mistral_q(m):
    attn = m.model.layers[0].self_attn
    attn.q_proj = torch.nn.Linear(64, 64, bias=True)


def _quant_module(m):
    m.model.layers[0].mlp.up_proj = QuantLinear(64, 96, bias=False)


REFUSALS = [
    # (family, config overrides, mutation, patch_model kwargs, message)
    ("gpt2", {}, None, {}, "model_type 'gpt2' is not supported"),
    ("llama", {"hidden_act": "gelu"}, None, {}, "hidden_act = 'gelu'"),
    ("llama", {"hidden_act": "relu"}, None, {}, "hidden_act = 'relu'"),
    ("gemma2", {"hidden_activation": "gelu"}, None, {}, "hidden_activation = 'gelu'"),
    ("llama", {"attention_bias": True}, None, {}, "attention_bias = True"),
    ("llama", {"mlp_bias": True}, None, {}, "mlp_bias = True"),
    ("gemma", {"attention_bias": True}, None, {}, "attention_bias = True"),
    ("mistral", {}, _bias_on_mistral_q, {}, "q_proj has a bias, which the family has none of"),
    ("llama", {}, _quant_module, {}, "up_proj is QuantLinear: not a plain torch.nn.Linear"),
    (
        "llama",
        {},
        lambda m: _set(m.config, quantization_config={"quant_method": "gptq"}),
        {},
        "quantization_config",
    ),
    ("llama", {}, lambda m: _set(m, _tp_size=2), {}, "tp_size = 2: tensor-parallel"),
    ("llama", {}, _shard_q, {}, "a tensor-parallel shard"),
    ("llama", {}, lambda m: m.train(), {}, "training mode"),
    ("llama", {}, lambda m: m.model.layers[1].mlp.to(torch.float64), {}, "mixes dtypes"),
    (
        "llama",
        {},
        lambda m: m.model.layers.__setitem__(0, torch.nn.Identity()),
        {},
        "layer 0 is Identity, not transformers' LlamaDecoderLayer",
    ),
    (
        "gemma",
        {},
        lambda m: m.model.layers[1].input_layernorm.weight.data.fill_(-1.0),
        {"originals": "drop"},
        "zero scale: originals='drop' could not unfold",
    ),
]


def _gpt2():
    cfg = T.GPT2Config(vocab_size=97, n_embd=64, n_layer=1, n_head=4, n_positions=32)
    return T.GPT2LMHeadModel(cfg).eval()


@pytest.mark.parametrize("row", REFUSALS, ids=[r[4][:40] for r in REFUSALS])
def test_refusals(pkg, row):
    family, config, mutate, kwargs, message = row
    model = _gpt2() if family == "gpt2" else tiny(family, **config)
    if mutate is not None:
        mutate(model)
    snap = snapshot(model)
    with pytest.raises(rt(pkg).PatchModelError, match=message.replace("(", r"\(")) as got:
        pkg.patch_model(model, **kwargs)
    assert family in str(got.value) or family == "gpt2"
    assert_same(model, snap)  # refused before anything changed


def test_refuses_twice_and_patch_linear_first(pkg):
    model = tiny("llama", torch.float16)
    with pkg.patch_model(model), pytest.raises(rt(pkg).PatchModelError, match="already"):
        pkg.patch_model(model)
    lin = pkg.patch_linear(model)
    # the tiny shapes are not in the table: patch_linear patched nothing, so patch_model can
    assert lin.names == []
    with pkg.patch_model(model):
        pass


def test_refuses_a_patch_linear_layer(tiny_table_package):
    model = tiny("llama", torch.float16)
    with tiny_table_package.patch_linear(model) as lin:
        assert "lm_head" in lin.names
        with pytest.raises(
            rt(tiny_table_package).PatchModelError, match="already patched by patch_linear"
        ):
            tiny_table_package.patch_model(model)


def test_refuses_transformers_4(pkg, monkeypatch):
    monkeypatch.setattr(rt(pkg), "transformers_version", lambda: (4, 57))
    model = tiny("llama")
    with pytest.raises(rt(pkg).PatchModelError, match="transformers 4.57 is older than 5.0"):
        pkg.patch_model(model)


def test_bad_originals(pkg):
    with pytest.raises(ValueError, match="originals must be one of"):
        pkg.patch_model(tiny("llama"), originals="gpu")


def test_the_wheel_exports_patch_model(pkg):
    assert "patch_model" in pkg.__all__
    model = copy.deepcopy(tiny("phi3"))
    with pkg.patch_model(model) as patch:
        assert repr(patch) == "ModelPatch(2 layers, originals='keep')"
