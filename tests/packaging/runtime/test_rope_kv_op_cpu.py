"""``linear_rope_kv`` (the Api call and ``torch.ops.<ns>.linear_rope_kv``) without a GPU:
where no kernel runs, both give the reference (``rope_kv.fallback``) and write the same
cache slots as transformers' sequence (F.linear on the natural-order weight,
``apply_rotary_pos_emb``, ``index_copy_``), leave every other slot alone, count their
fallback reason; hostile operands raise naming the operand; the op's schema declares
exactly the caches as mutated (``torch.library.opcheck``) and its fake impl gives the
output's shape."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from cudal2.packaging.runtime import fused, rope_kv  # noqa: E402

HEADS = (4, 2, 8)  # N = 64
K = 32


def _inputs(batch=2, seq=1, length=6, dtype=torch.float32, bias=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, kv, d = HEADS
    n = (q + 2 * kv) * d
    x = torch.randn(batch, seq, K, generator=g).to(dtype)
    w = (torch.randn(n, K, generator=g) / K**0.5).to(dtype)
    b = torch.randn(n, generator=g).to(dtype) if bias else None
    angle = torch.rand(batch, seq, d, generator=g) * 6.28
    cos, sin = angle.cos().to(dtype), angle.sin().to(dtype)
    kc = torch.randn(batch, kv, length, d, generator=g).to(dtype)
    vc = torch.randn(batch, kv, length, d, generator=g).to(dtype)
    positions = torch.arange(seq) + 3
    return x, w, b, cos, sin, kc, vc, positions


def _transformers(x, w_nat, b_nat, cos, sin, kc, vc, positions, eps=1e-5):
    """transformers' sequence on the natural-order weight (a copy of the caches)."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    q, kv, d = HEADS
    batch, seq, _ = x.shape
    y = torch.nn.functional.linear(fused.rms_normed(x, eps), w_nat, b_nat)
    y = y.view(batch, seq, -1, d).transpose(1, 2)
    qs, ks, vs = y[:, :q], y[:, q : q + kv], y[:, q + kv :]
    qs, ks = apply_rotary_pos_emb(qs, ks, cos, sin)
    kc, vc = kc.clone(), vc.clone()
    kc.index_copy_(2, positions, ks)
    vc.index_copy_(2, positions, vs)
    return qs.transpose(1, 2).reshape(batch, seq, q * d), kc, vc


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("seq", [1, 3])
def test_the_call_and_the_op_are_transformers_sequence(package, bias, seq):
    x, w, b, cos, sin, kc, vc, positions = _inputs(seq=seq, bias=bias)
    want_q, want_k, want_v = _transformers(x, w, b, cos, sin, kc, vc, positions)
    packed = rope_kv.pack_rope_rows(w, HEADS)
    packed_b = None if b is None else rope_kv.pack_rope_rows(b, HEADS)
    op = getattr(torch.ops, package.NAMESPACE).linear_rope_kv
    package.stats.reset()
    for call in (package.linear_rope_kv, op):
        k2, v2 = kc.clone(), vc.clone()
        got = call(x, packed, 1e-5, packed_b, cos, sin, k2, v2, positions, list(HEADS))
        torch.testing.assert_close(got, want_q, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(k2, want_k, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(v2, want_v, rtol=1e-5, atol=1e-5)
        untouched = [s for s in range(kc.shape[2]) if s not in positions.tolist()]
        assert torch.equal(k2[:, :, untouched], kc[:, :, untouched])
    # fp32: no kernel takes it (reason dtype): the reference, counted
    assert package.stats.fallbacks == {"dtype": 2} and not package.stats.hits


HOSTILE = [
    ("heads", dict(heads=[4, 1, 8]), ValueError, "heads .*N = 64"),
    ("k_cache dtype", dict(kc=torch.zeros(2, 2, 6, 8, dtype=torch.float16)), ValueError,
     "k_cache is torch.float16"),
    ("v_cache shape", dict(vc=torch.zeros(2, 3, 6, 8)), ValueError, "v_cache must be"),
    ("position past L", dict(positions=torch.tensor([6])), ValueError, "positions must lie"),
    ("cos rows", dict(cos=torch.zeros(3, 8)), ValueError, "cos must be a contiguous"),
    ("eps", dict(eps=float("nan")), ValueError, "eps must be a finite"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("case", "change", "error", "needle"), HOSTILE, ids=[h[0] for h in HOSTILE]
)
def test_hostile_operands_raise_naming_the_operand(package, case, change, error, needle):
    x, w, b, cos, sin, kc, vc, positions = _inputs()
    args = dict(x=x, w=w, eps=1e-5, b=b, cos=cos, sin=sin, kc=kc, vc=vc, positions=positions)
    args["heads"] = list(HEADS)
    args.update(change)
    order = ("x", "w", "eps", "b", "cos", "sin", "kc", "vc", "positions", "heads")
    op = getattr(torch.ops, package.NAMESPACE).linear_rope_kv
    for call in (package.linear_rope_kv, op):
        with pytest.raises(error, match=needle):
            call(*(args[n] for n in order))


def test_the_ops_schema_mutates_the_caches_alone(package):
    x, w, b, cos, sin, kc, vc, positions = _inputs()
    op = getattr(torch.ops, package.NAMESPACE).linear_rope_kv
    schema = op.default._schema
    mutated = [a.name for a in schema.arguments if a.alias_info and a.alias_info.is_write]
    assert mutated == ["k_cache", "v_cache"]
    args = (x, rope_kv.pack_rope_rows(w, HEADS), 1e-5, rope_kv.pack_rope_rows(b, HEADS),
            cos, sin, kc, vc, positions, list(HEADS))  # fmt: skip
    torch.library.opcheck(op.default, args, test_utils=("test_schema", "test_faketensor"))
