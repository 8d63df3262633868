"""The RoPE + KV-cache epilogues' torch side on CPU (``_runtime/rope_kv.py``): the packed
row order round-trips, the one reference (``rope_kv.fallback``: RMSNorm, the GEMM on the
packed weight, RoPE on the pairs, the cache writes) against transformers' own attention
front (input norm, q/k/v projections, ``apply_rotary_pos_emb``, ``StaticCache.update``)
on tiny random Llama and Qwen2 configs in fp32, and the operand rules as a table of
hostile inputs, each refused naming the operand."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from cudal2.packaging.runtime import fused, rope_kv  # noqa: E402
from cudal2.packaging.runtime.abi import RopeKvArgs  # noqa: E402


@pytest.mark.parametrize("heads", [(4, 2, 8), (2, 2, 6), (1, 1, 2), (8, 1, 16)])
def test_the_packed_rows_round_trip_and_pair_each_rope_half(heads):
    q, kv, d = heads
    n = (q + 2 * kv) * d
    perm = rope_kv.rope_row_permutation(q, kv, d)
    assert sorted(perm) == list(range(n))  # a permutation
    for h in range(q + kv):  # every q and k head: pairs (i, i + D/2) side by side
        for i in range(d // 2):
            assert perm[h * d + 2 * i : h * d + 2 * i + 2] == [h * d + i, h * d + i + d // 2]
    assert perm[(q + kv) * d :] == list(range((q + kv) * d, n))  # v in natural order
    w = torch.randn(n, 5)
    b = torch.randn(n)
    assert torch.equal(rope_kv.unpack_rope_rows(rope_kv.pack_rope_rows(w, heads), heads), w)
    assert torch.equal(rope_kv.unpack_rope_rows(rope_kv.pack_rope_rows(b, heads), heads), b)
    assert torch.equal(rope_kv.pack_rope_rows(w, heads), w[perm])


def _config(family: str):
    common = dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        rms_norm_eps=1e-5,
        max_position_embeddings=64,
    )
    if family == "llama":
        return transformers.LlamaConfig(**common)
    return transformers.Qwen2Config(**common)  # q, k, v with bias


def _layer(family: str):
    config = _config(family)
    torch.manual_seed(0)
    if family == "llama":
        from transformers.models.llama import modeling_llama as mod

        layer = mod.LlamaDecoderLayer(config, 0)
        rotary = mod.LlamaRotaryEmbedding(config)
    else:
        from transformers.models.qwen2 import modeling_qwen2 as mod

        layer = mod.Qwen2DecoderLayer(config, 0)
        rotary = mod.Qwen2RotaryEmbedding(config)
    with torch.no_grad():  # random norm weight and biases: nothing left at 1 or 0
        for p in layer.parameters():
            p.normal_(0, 0.2)
        layer.input_layernorm.weight.add_(1.0)
    return config, layer, rotary


@pytest.mark.parametrize("shared", [False, True], ids=["per_row", "shared"])
@pytest.mark.parametrize(("batch", "seq", "start"), [(1, 1, 5), (3, 1, 0), (2, 4, 7)])
@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_the_reference_is_transformers_rope_and_static_cache(family, batch, seq, start, shared):
    """``shared``: position_ids [1, seq], so cos and sin are [1, seq, D] for the whole
    batch (what transformers passes when no per-sequence positions are given)."""
    config, layer, rotary = _layer(family)
    attn = layer.self_attn
    heads = (config.num_attention_heads, config.num_key_value_heads, config.head_dim)
    q_heads, kv_heads, d = heads
    length = 16
    x = torch.randn(batch, seq, config.hidden_size)
    positions = torch.arange(seq) + start
    position_ids = positions[None] if shared else positions.expand(batch, seq)
    cos, sin = rotary(x, position_ids)
    assert cos.shape == ((1 if shared else batch), seq, config.head_dim)

    # transformers: the cache holds `start` earlier tokens (random), then this step
    cache = transformers.StaticCache(config=config, max_cache_len=length)
    earlier_k = torch.randn(batch, kv_heads, start, d)
    earlier_v = torch.randn(batch, kv_heads, start, d)
    with torch.no_grad():
        if start:
            cache.update(earlier_k, earlier_v, 0)
        h = layer.input_layernorm(x)
        shape = (batch, seq, -1, d)
        qs = attn.q_proj(h).view(shape).transpose(1, 2)
        ks = attn.k_proj(h).view(shape).transpose(1, 2)
        vs = attn.v_proj(h).view(shape).transpose(1, 2)
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        qs, ks = apply_rotary_pos_emb(qs, ks, cos, sin)
        want_k, want_v = cache.update(ks, vs, 0)
    want_q = qs.transpose(1, 2).reshape(batch, seq, q_heads * d)

    # the reference: one packed weight with the norm folded, the caches written in place
    w = torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight])
    w = rope_kv.pack_rope_rows(fused.fold_rmsnorm(w, layer.input_layernorm.weight), heads)
    bias = None
    if family == "qwen2":
        bias = torch.cat([attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias])
        bias = rope_kv.pack_rope_rows(bias, heads)
    k_cache = torch.zeros(batch, kv_heads, length, d)
    v_cache = torch.zeros(batch, kv_heads, length, d)
    k_cache[:, :, :start] = earlier_k
    v_cache[:, :, :start] = earlier_v
    m = batch * seq
    rope_kv.check_operands(
        "test", m, w.shape[0], x.dtype, x.device, heads, cos, sin, k_cache, v_cache, positions
    )
    with torch.no_grad():
        got_q = rope_kv.fallback(
            x, w, config.rms_norm_eps, bias, cos, sin, k_cache, v_cache, positions, heads
        )
    torch.testing.assert_close(got_q, want_q, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(k_cache, want_k, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(v_cache, want_v, rtol=1e-5, atol=1e-5)


def test_kernel_args_are_the_tensors_pointers_and_strides():
    heads = (4, 2, 8)
    k_cache = torch.zeros(3, 2, 10, 8)
    v_cache = torch.zeros(3, 2, 12, 8)[:, :, :10]  # a view: its own strides
    cos, sin = torch.zeros(3, 8), torch.zeros(3, 8)
    positions = torch.tensor([4])
    got = rope_kv.kernel_args(heads, cos, sin, k_cache, v_cache, positions)
    assert got == RopeKvArgs(
        cos.data_ptr(), sin.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(),
        positions.data_ptr(), 1, 1, 10, 4, 2, 8, (160, 80, 8), (192, 96, 8),
    )  # fmt: skip
    assert len(got.flat()) == 17
    # cos, sin shared by the batch ([seq, D]): no rows between sequences
    shared = rope_kv.kernel_args(heads, cos[:1], sin[:1], k_cache, v_cache, positions)
    assert shared.cos_batch == 0 and shared.seq == 1


def _operands(**change):
    """A good call (M = 6 rows: batch 3, seq 2; heads 4/2/8; L 10), with ``change``."""
    ops = dict(
        m=6,
        n=64,
        dtype=torch.float16,
        device=torch.device("cpu"),
        heads=(4, 2, 8),
        cos=torch.zeros(3, 2, 8, dtype=torch.float16),
        sin=torch.zeros(6, 8, dtype=torch.float16),
        k_cache=torch.zeros(3, 2, 10, 8, dtype=torch.float16),
        v_cache=torch.zeros(3, 2, 10, 8, dtype=torch.float16),
        positions=torch.tensor([3, 4]),
    )
    ops.update(change)
    return ops


F16 = torch.float16
HOSTILE = [
    ("heads mismatch N", dict(heads=(4, 1, 8)), ValueError, "heads .*N = 64 is not"),
    ("heads of two", dict(heads=(4, 2)), ValueError, "heads must be three positive"),
    ("heads zero", dict(heads=(0, 2, 8)), ValueError, "heads must be three positive"),
    ("heads bool", dict(heads=(True, 2, 8)), ValueError, "heads must be three positive"),
    ("odd head_dim", dict(n=45, heads=(3, 1, 9)), ValueError, "head_dim 9 must be even"),
    ("cos dtype", dict(cos=torch.zeros(6, 8)), ValueError, "cos is torch.float32"),
    ("sin shape", dict(sin=torch.zeros(6, 16, dtype=F16)), ValueError, "sin must be a contiguous"),
    ("sin rows", dict(sin=torch.zeros(5, 8, dtype=F16)), ValueError, "sin must be a contiguous"),
    ("sin not cos's", dict(sin=torch.zeros(2, 8, dtype=F16)), ValueError, "is not cos's shape"),
    (
        "cos strided",
        dict(cos=torch.zeros(6, 16, dtype=F16)[:, :8]),
        ValueError,
        "cos must be a contiguous",
    ),
    ("cos not a tensor", dict(cos=[0.0] * 48), TypeError, "cos must be a torch.Tensor"),
    (
        "k_cache dtype",
        dict(k_cache=torch.zeros(3, 2, 10, 8)),
        ValueError,
        "k_cache is torch.float32",
    ),
    (
        "k_cache heads",
        dict(k_cache=torch.zeros(3, 4, 10, 8, dtype=F16)),
        ValueError,
        "k_cache must be \\[B, kv_heads, L, head_dim\\] = \\[3, 2, L, 8\\]",
    ),
    (
        "v_cache batch",
        dict(v_cache=torch.zeros(2, 2, 10, 8, dtype=F16)),
        ValueError,
        "v_cache must be \\[B, kv_heads",
    ),
    (
        "v_cache rank",
        dict(v_cache=torch.zeros(3, 2, 80, dtype=F16)),
        ValueError,
        "v_cache must be \\[B, kv_heads",
    ),
    (
        "v_cache inner stride",
        dict(v_cache=torch.zeros(3, 2, 10, 16, dtype=F16)[..., ::2]),
        ValueError,
        "v_cache must have a unit inner stride",
    ),
    (
        "cache lengths differ",
        dict(v_cache=torch.zeros(3, 2, 11, 8, dtype=F16)),
        ValueError,
        "k_cache holds L = 10 slots but v_cache 11",
    ),
    (
        "positions int32",
        dict(positions=torch.tensor([3, 4], dtype=torch.int32)),
        ValueError,
        "positions must be a 1-D int64",
    ),  # fmt: skip
    (
        "positions 2-D",
        dict(positions=torch.tensor([[3, 4]])),
        ValueError,
        "positions must be a 1-D",
    ),
    (
        "positions empty",
        dict(positions=torch.tensor([], dtype=torch.int64)),
        ValueError,
        "positions must be a 1-D",
    ),  # fmt: skip
    (
        "rows not whole seqs",
        dict(positions=torch.tensor([1, 2, 3, 4])),
        ValueError,
        "M = 6 rows is not a whole number of seq = 4",
    ),  # fmt: skip
    (
        "position past L",
        dict(positions=torch.tensor([9, 10])),
        ValueError,
        "positions must lie in \\[0, 10\\)",
    ),  # fmt: skip
    (
        "position negative",
        dict(positions=torch.tensor([-1, 0])),
        ValueError,
        "positions must lie in \\[0, 10\\)",
    ),  # fmt: skip
]


@pytest.mark.parametrize(
    ("case", "change", "error", "needle"), HOSTILE, ids=[h[0] for h in HOSTILE]
)
def test_hostile_operands_are_refused_naming_the_operand(case, change, error, needle):
    with pytest.raises(error, match=needle):
        rope_kv.check_operands("linear_rope_kv", **_operands(**change))


def test_the_good_call_passes():
    assert rope_kv.check_operands("linear_rope_kv", **_operands()) == (4, 2, 8)
    shared = torch.zeros(1, 2, 8, dtype=torch.float16)  # [1, seq, D]: the batch's rows
    got = rope_kv.check_operands("linear_rope_kv", **_operands(cos=shared, sin=shared))
    assert got == (4, 2, 8)


def test_the_packers_refuse_a_bad_head_split():
    with pytest.raises(ValueError, match="pack_rope_rows: heads .*N = 10"):
        rope_kv.pack_rope_rows(torch.zeros(10, 4), (1, 1, 4))
    with pytest.raises(ValueError, match="qkv weight"):
        rope_kv.pack_rope_rows(torch.zeros(2, 2, 2), (1, 1, 2))
