"""The correctness suite for RoPE and the KV-cache write (``rmsnorm_rope_kv``,
``rmsnorm_bias_rope_kv``), its logic run on the CPU (operands made on the CPU, the same
code otherwise): an honest kernel written from the spec (per packed pair, element by
element: not the suite's code) passes; kernels that break one thing each (a sign, the
pair order, a missed or wrong slot, a write outside the slots, the row scale, no bias,
a cache written from another row) are rejected with a reason; the launch arguments
(positions, strides, heads) come from the trial's tensors; torch's unfused sequence is
transformers' (checked against the reference)."""

from __future__ import annotations

import re

import pytest

from cudal2.records import Target
from cudal2.verify import correctness, rope_kv
from cudal2.verify.launch import tensor_epilogue

torch = pytest.importorskip("torch")

ROPE = ["rmsnorm_rope_kv", "rmsnorm_bias_rope_kv"]
HEADS = (4, 2, 8)  # N = 64


@pytest.fixture(autouse=True)
def on_cpu(monkeypatch):
    monkeypatch.setattr(correctness, "DEVICE", "cpu")


def _target(epilogue: str, dtype: str = "fp16", m: int = 6, k: int = 96) -> Target:
    return Target("sm_90a", dtype, "tn", m, 64, k, epilogue=epilogue, heads=HEADS)


def _kernel(a, b, c, epi, break_=None, eps=1e-5):
    """The spec, loop by loop: acc, row scale, + bias, then per row m and packed pair
    (2i, 2i + 1) of a q or k head the rotation, v as it is; q into C, k and v into the
    caches at slot positions[m % seq] of batch m // seq. ``break_`` breaks one thing."""
    q, kv, d = HEADS
    acc = a.float() @ b.float().t()
    if break_ != "no_scale":
        acc = acc / torch.sqrt((a.float() ** 2).sum(1, keepdim=True) / a.shape[1] + eps)
    if "bias" in epi and break_ != "no_bias":
        acc = acc + epi["bias"].float()
    seq = epi["positions"].numel()
    cos, sin = epi["cos"].float(), epi["sin"].float()
    for m in range(a.shape[0]):
        bi, s = divmod(m, seq)
        pos = int(epi["positions"][s]) + (1 if break_ == "wrong_slot" else 0)
        pos %= epi["k_cache"].shape[2]
        for h in range(q + 2 * kv):
            if break_ == "skip_slot" and h == q and m == 0:
                continue
            row = m if break_ != "other_row" or h < q else (m + 1) % a.shape[0]
            for i in range(d // 2):
                x0, x1 = acc[row, h * d + 2 * i], acc[row, h * d + 2 * i + 1]
                if break_ == "pair_order":
                    x0, x1 = x1, x0
                if h < q + kv:
                    sign = -1.0 if break_ != "sign" else 1.0
                    lo = x0 * cos[m, i] + sign * x1 * sin[m, i]
                    hi = x1 * cos[m, i + d // 2] + x0 * sin[m, i + d // 2]
                    vals, cols = (lo, hi), (i, i + d // 2)
                else:
                    vals, cols = (x0, x1), (2 * i, 2 * i + 1)
                if h < q:
                    dst = c[m, h * d : (h + 1) * d]
                elif h < q + kv:
                    dst = epi["k_cache"][bi, h - q, pos]
                else:
                    dst = epi["v_cache"][bi, h - q - kv, pos]
                for col, val in zip(cols, vals, strict=True):
                    dst[col] = val
    if break_ == "outside":
        slot = (int(epi["positions"].max()) + 1) % epi["v_cache"].shape[2]
        if slot in epi["positions"].tolist():
            slot = (slot + 1) % epi["v_cache"].shape[2]
        epi["v_cache"][0, 0, slot, 0] = 0.5


def _run(break_=None):
    def run(a, b, c, epi=None):
        _kernel(a, b, c, epi, break_)

    return run


@pytest.mark.parametrize("m", [1, 6, 3])
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("epilogue", ROPE)
def test_an_honest_kernel_passes(epilogue, dtype, m):
    t = _target(epilogue, dtype, m=m)
    res = correctness.check(t, _run(), 5)
    assert res.ok, res.error
    assert res.vendors == (f"torch+{epilogue}",)
    assert res.max_abs_err > 0  # compared, not skipped


BROKEN = [
    ("sign", "max \\|error\\|"),
    ("pair_order", "max \\|error\\|"),
    ("no_scale", "max \\|error\\|"),
    ("wrong_slot", "outside the written slots changed"),
    ("skip_slot", "output elements not written"),
    ("outside", "elements of v_cache outside the written slots changed"),
    ("other_row", "max \\|error\\|"),
]


@pytest.mark.parametrize(("break_", "needle"), BROKEN, ids=[b for b, _ in BROKEN])
def test_a_broken_kernel_is_rejected(break_, needle):
    res = correctness.check(_target("rmsnorm_bias_rope_kv"), _run(break_), 5)
    assert not res.ok and res.error
    assert re.search(needle, res.error), res.error


def test_a_kernel_without_its_bias_is_rejected():
    res = correctness.check(_target("rmsnorm_bias_rope_kv"), _run("no_bias"), 5)
    assert not res.ok and "max |error|" in res.error


def test_a_kernel_that_writes_its_positions_is_rejected():
    def run(a, b, c, epi=None):
        _kernel(a, b, c, epi)
        epi["positions"].add_(0)
        epi["cos"][0, 0] = 2.0

    res = correctness.check(_target("rmsnorm_rope_kv"), run, 5)
    assert not res.ok and "wrote into its input(s) cos" in res.error


def test_the_operands_and_launch_arguments():
    t = _target("rmsnorm_bias_rope_kv", m=6)
    trial = correctness.draw(t, 5, 0, "random")
    epi = trial.epi
    batch, seq, length = rope_kv.layout(t)
    assert (batch, seq) == (3, 2)
    assert epi["k_cache"].shape == (3, 2, length, 8) and epi["positions"].dtype == torch.int64
    assert len(set(epi["positions"].tolist())) == seq  # distinct slots
    # only the slots to be written are NaN
    nan = torch.isnan(epi["k_cache"].float())
    assert nan[:, :, epi["positions"]].all() and int(nan.sum()) == 3 * 2 * seq * 8
    assert trial.ref.shape == (6, 64) and t.out_n == 32
    ops = tensor_epilogue(t, epi)
    assert ops.bias == epi["bias"].data_ptr() and ops.ldr == t.out_n and ops.eps == 1e-5
    r = ops.rope_kv
    assert (r.seq, r.cache_len, r.q_heads, r.kv_heads, r.head_dim) == (2, length, 4, 2, 8)
    assert r.positions == epi["positions"].data_ptr()
    assert r.k_strides == tuple(epi["k_cache"].stride()[:3])
    # a run gets copies of the caches, the rest as drawn
    call = trial.for_call()
    assert call["k_cache"].data_ptr() != epi["k_cache"].data_ptr()
    assert call["cos"].data_ptr() == epi["cos"].data_ptr()


def test_torchs_sequence_is_transformers_on_the_natural_weight():
    """The yardstick's [M, N] (q, then the slots it wrote) is the fp32 reference within
    fp16 rounding; its weight is B unpacked (the baseline pays no permutation)."""
    from cudal2.packaging.runtime import rope_kv as runtime

    t = _target("rmsnorm_bias_rope_kv", m=6)
    trial = correctness.draw(t, 5, 1, "random")
    assert torch.equal(runtime.pack_rope_rows(trial.epi["qkv_weight"], HEADS), trial.b)
    assert torch.equal(runtime.pack_rope_rows(trial.epi["qkv_bias"], HEADS), trial.epi["bias"])
    (err,) = correctness.unfused_error(t, trial.a, trial.b, trial.epi, trial.ref).values()
    assert 0 < err < 0.05 * float(trial.ref.abs().max())
    before = trial.epi["k_cache"].clone()
    correctness.unfused_error(t, trial.a, trial.b, trial.epi, trial.ref)
    assert torch.equal(before.view(torch.int16), trial.epi["k_cache"].view(torch.int16))
