"""The correctness suite for the gated-activation and RMSNorm row-scale epilogues, its
logic run on the CPU (operands made on the CPU, the same code otherwise): the fp32
reference of the spec (row scale from A, activation over the pair interleave), the
[M, N/2] output of a gated one checked element by element, torch's unfused op as the
yardstick, the {0,1} trial bounded rather than exact, and the launch arguments (ldc =
out_n, eps)."""

from __future__ import annotations

import math

import pytest

from cudal2.records import EPILOGUE_ACTIVATION, ROW_SCALED, JobResult, Status, Target
from cudal2.verify import correctness
from cudal2.verify.launch import dense_epilogue, dense_strides

torch = pytest.importorskip("torch")

NEW = ["silu", "gelu_tanh", "rmsnorm", "rmsnorm_bias", "rmsnorm_silu", "rmsnorm_gelu_tanh"]


@pytest.fixture(autouse=True)
def on_cpu(monkeypatch):
    monkeypatch.setattr(correctness, "DEVICE", "cpu")


def _gen(seed: int = 5):
    g = torch.Generator()
    g.manual_seed(seed)
    return g


def _target(epilogue: str, dtype: str = "fp16", m: int = 24, n: int = 40, k: int = 96) -> Target:
    return Target("sm_90a", dtype, "tn", m, n, k, epilogue=epilogue)


def _silu(g):
    return g / (1 + torch.exp(-g))


def _gelu_tanh(g):
    return 0.5 * g * (1 + torch.tanh(math.sqrt(2 / math.pi) * (g + 0.044715 * g**3)))


def _fused(epilogue, a, b, c, epi, *, scale=True, swap=False, halves=False, act=None, eps=1e-5):
    """An honest fused kernel written from the spec's formulas (not the suite's code):
    fp32 accumulator, row scale, + bias, the gated activation, one rounding. The
    keywords break one thing each."""
    acc = a.float() @ b.float().t()
    if epilogue.startswith("rmsnorm") and scale:
        acc = acc / torch.sqrt((a.float() ** 2).sum(1, keepdim=True) / a.shape[1] + eps)
    if "bias" in epi:
        acc = acc + epi["bias"].float()
    name = act or {"silu": _silu, "gelu_tanh": _gelu_tanh}.get(
        epilogue.removeprefix("rmsnorm_") if epilogue != "rmsnorm" else ""
    )
    if name is not None:
        n = acc.shape[1]
        g, u = (acc[:, : n // 2], acc[:, n // 2 :]) if halves else (acc[:, 0::2], acc[:, 1::2])
        if swap:
            g, u = u, g
        acc = name(g) * u
    c.copy_(acc.to(c.dtype))


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("epilogue", NEW)
def test_an_honest_fused_kernel_passes(epilogue, dtype):
    shapes = []

    def run(a, b, c, epi=None):
        shapes.append(tuple(c.shape))
        _fused(epilogue, a, b, c, epi or {})

    t = _target(epilogue, dtype)
    res = correctness.check(t, run, 5)
    assert res.ok, res.error
    assert res.vendors == (f"torch+{epilogue}",)
    # the output is [M, out_n] in every trial (N/2 columns for a gated epilogue)
    want = (24, 20) if epilogue in EPILOGUE_ACTIVATION else (24, 40)
    assert shapes == [want] * 5


@pytest.mark.parametrize(
    ("epilogue", "broken", "needle"),
    [
        # gate and up swapped: act(u) * g
        ("silu", {"swap": True}, "bound"),
        ("rmsnorm_gelu_tanh", {"swap": True}, "bound"),
        # the packed rows read as two halves instead of the pair interleave
        ("silu", {"halves": True}, "bound"),
        ("rmsnorm_silu", {"halves": True}, "bound"),
        # the wrong activation
        ("gelu_tanh", {"act": _silu}, "bound"),
        ("silu", {"act": _gelu_tanh}, "bound"),
        # the row scale left out
        ("rmsnorm", {"scale": False}, "bound"),
        ("rmsnorm_bias", {"scale": False}, "bound"),
        ("rmsnorm_silu", {"scale": False}, "bound"),
        # an eps far off (1.0: the scale of a uniform(-1, 1) row's mean square)
        ("rmsnorm", {"eps": 1.0}, "bound"),
    ],
)  # fmt: skip
def test_a_wrong_epilogue_is_rejected(epilogue, broken, needle):
    def run(a, b, c, epi=None):
        _fused(epilogue, a, b, c, epi or {}, **broken)

    res = correctness.check(_target(epilogue), run, 5)
    assert not res.ok and needle in res.error, res.error


@pytest.mark.parametrize("epilogue", ["silu", "rmsnorm_silu", "rmsnorm"])
def test_every_output_element_is_checked(epilogue):
    """The last column of the [M, out_n] output left unwritten (NaN-filled before the
    run) is caught; so is a gated kernel that writes only the first half's worth of
    rows."""

    def last_column(a, b, c, epi=None):
        full = torch.empty_like(c)
        _fused(epilogue, a, b, full, epi or {})
        c[:, :-1] = full[:, :-1]

    res = correctness.check(_target(epilogue), last_column, 5)
    assert not res.ok and "not written" in res.error, res.error


def test_the_exact_trial_is_bounded_not_exact_for_these_epilogues():
    """A kernel one unit in the last place off (which the plain exact trial rejects)
    passes the {0,1} trial of a row-scaled epilogue under the bound; a gross error in
    the {0,1} trial only is still rejected."""
    t = _target("rmsnorm")
    calls = []

    def honest(a, b, c, epi=None):
        calls.append(1)
        _fused("rmsnorm", a, b, c, epi or {})

    assert correctness.check(t, honest, 5).ok

    def wrong_on_exact(a, b, c, epi=None):
        _fused("rmsnorm", a, b, c, epi or {})
        if set(torch.unique(a.float()).tolist()) <= {0.0, 1.0}:
            c.mul_(1.5)

    res = correctness.check(t, wrong_on_exact, 5)
    assert not res.ok and res.error.startswith("exact {0,1} trial"), res.error


@pytest.mark.parametrize(
    ("epilogue", "dtype", "k", "ones"),
    [
        ("none", "fp16", 4096, 2048),
        ("bias", "fp16", 4096, 2046),
        ("rmsnorm", "bf16", 4096, 254),
        ("silu", "fp16", 4096, 181),
        ("gelu_tanh", "bf16", 4096, 181),
        ("rmsnorm_silu", "fp16", 4096, 7),  # sqrt(4096 * 7) = 169 <= 181
        ("rmsnorm_gelu_tanh", "fp16", 28672, 1),
        ("silu", "fp16", 96, 96),
    ],
)  # fmt: skip
def test_the_exact_trial_keeps_a_gated_product_finite(epilogue, dtype, k, ones):
    t = Target("sm_90a", dtype, "tn", 4, 16, k, epilogue=epilogue)
    assert correctness.exact_ones(t) == ones
    a, b = correctness.operands(t, "exact", _gen())
    assert int(a.float().sum(1).max()) == ones
    ref = correctness.reference(t, a, b)
    # representable in fp16 (the narrower range): the output cannot overflow
    assert float(ref.abs().max()) < 65504


def test_the_reference_follows_the_spec():
    """By hand on a 1 x 4 GEMM: rs from A, the pair interleave, silu(g) * u."""
    t = Target("sm_90a", "fp16", "tn", 1, 4, 2, epilogue="rmsnorm_silu")
    a = torch.tensor([[3.0, 4.0]], dtype=torch.float16)  # mean square 12.5
    b = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.0, 2.0]], dtype=torch.float16)
    rs = 1 / math.sqrt(12.5 + correctness.EPS)
    acc = [3 * rs, 4 * rs, 7 * rs, 8 * rs]  # rows 0, 2: gate; rows 1, 3: up
    want = [acc[0] / (1 + math.exp(-acc[0])) * acc[1], acc[2] / (1 + math.exp(-acc[2])) * acc[3]]
    got = correctness.reference(t, a, b)
    assert got.shape == (1, 2)
    assert got[0].tolist() == pytest.approx(want, rel=1e-6)


def test_the_yardstick_is_torchs_unfused_op_in_the_dtype():
    """torch's RMSNorm rounded to the dtype, the GEMM, then the activation: its
    deviation from the fp32 reference is not zero, and the gated one writes ``out``
    [M, N/2] (the worker's timing buffers)."""
    t = _target("rmsnorm_gelu_tanh", "bf16")
    a, b = correctness.operands(t, "random", _gen())
    ref = correctness.reference(t, a, b)
    unfused = correctness.vendor(t, a, b)
    assert unfused.shape == (24, 20) and unfused.dtype == torch.bfloat16
    out = torch.full((24, 20), float("nan"), dtype=torch.bfloat16)
    assert correctness.vendor(t, a, b, out=out) is out and torch.equal(out, unfused)
    err = correctness.unfused_error(t, a, b, {}, ref)
    assert err["torch+rmsnorm_gelu_tanh"] > 0
    # the norm is in the yardstick: without it the deviation is gross
    plain = correctness.vendor(_target("gelu_tanh", "bf16"), a, b)
    assert correctness.max_abs_error(plain, ref) > 4 * err["torch+rmsnorm_gelu_tanh"]


@pytest.mark.parametrize("epilogue", ["silu", "gelu_tanh", "rmsnorm_silu", "rmsnorm_gelu_tanh"])
def test_the_gated_yardstick_is_an_unpacked_mlps_ops(epilogue, monkeypatch):
    """A gated tn baseline is what a model without cudal2 runs: its gate weight and
    its up weight, each its own contiguous matrix, one GEMM each, then the activation
    on contiguous tensors (not one GEMM over the packed weight and the activation on
    its strided halves, which costs a quarter more on the GPU)."""
    f = torch.nn.functional
    seen = []
    for name in ("silu", "gelu"):
        op = getattr(f, name)
        monkeypatch.setattr(f, name, lambda g, *a, op=op, **k: seen.append(g) or op(g, *a, **k))
    t = _target(epilogue)
    a, b = correctness.operands(t, "random", _gen())
    gate_w, up_w = b[0::2].contiguous(), b[1::2].contiguous()
    x = correctness.rmsnorm(a) if epilogue in ROW_SCALED else a
    g, u = f.linear(x, gate_w), f.linear(x, up_w)
    silu = EPILOGUE_ACTIVATION[epilogue] == "silu"
    want = (f.silu(g) if silu else f.gelu(g, approximate="tanh")) * u
    seen.clear()
    assert torch.equal(correctness.vendor(t, a, b), want)
    assert [x.is_contiguous() for x in seen] == [True]


@pytest.mark.parametrize("epilogue", ["none", "bias", "residual", *NEW])
def test_the_launch_gives_ldc_out_n_and_eps(epilogue):
    t = Target("sm_90a", "fp16", "tn", 16, 28672, 4096, epilogue=epilogue)
    gated = epilogue in EPILOGUE_ACTIVATION
    assert dense_strides(t) == (4096, 4096, 14336 if gated else 28672)
    ops = dense_epilogue(t, 4, 5)
    if epilogue == "none":
        assert ops is None
        return
    assert ops.eps == (correctness.EPS if epilogue in ROW_SCALED else 0.0)
    assert (ops.bias, ops.residual, ops.ldr) == (4, 5, t.out_n)


@pytest.mark.parametrize("k", [96, 4096, 8192, 28672])
@pytest.mark.parametrize("epilogue", ["silu", "rmsnorm_silu", "rmsnorm_gelu_tanh"])
def test_a_gated_random_trial_stays_far_from_fp16s_range(epilogue, k):
    """B scaled by a power of two near 1/sqrt(K): the gated outputs stay below 2^10
    (unscaled, at K = 8192 they reach 25,829, within 3x of fp16's 65,504), the
    activation sees values near unit size, and the scaling is exact (every B value is
    a uniform draw times a power of two)."""
    t = Target("sm_90a", "fp16", "tn", 16, 1024, k, epilogue=epilogue)
    a, b = correctness.operands(t, "random", _gen())
    s = correctness.gated_b_scale(t)
    assert s == 2.0 ** -int(math.log2(math.sqrt(k))) and 1 / math.sqrt(k) <= s < 2 / math.sqrt(k)
    assert float(b.float().abs().max()) <= s
    ref = correctness.reference(t, a, b)
    assert 0.5 < float(ref.abs().max()) < 2.0**10
    plain = Target("sm_90a", "fp16", "tn", 16, 1024, k, epilogue="rmsnorm")
    assert correctness.gated_b_scale(plain) == 1.0


class _Tensor:
    def __init__(self, ptr: int):
        self.ptr = ptr

    def data_ptr(self) -> int:
        return self.ptr


@pytest.mark.parametrize(
    ("epilogue", "ldc", "eps"),
    [("rmsnorm_silu", 14336, correctness.EPS), ("gelu_tanh", 14336, 0.0),
     ("rmsnorm", 28672, correctness.EPS)],
)  # fmt: skip
def test_the_worker_launches_a_gated_design_with_ldc_out_n_and_eps(
    tmp_path, monkeypatch, epilogue, ldc, eps
):
    """The worker's ``run`` gives a one-tile gemm_v3 kernel C's row stride out_n (N/2
    for a gated one: the kernel's N stays the packed 2I) and the row scale's eps."""
    from cudal2.generator import design_name, launch_recipe
    from cudal2.generator.families import base, sm90_tma
    from cudal2.packaging.runtime.abi import EpilogueArgs
    from cudal2.pipeline.results import kernel_job
    from cudal2.records import BuildResult, TimingConfig
    from cudal2.verify import worker

    d = base.with_epilogue(sm90_tma.design("fp16", 1, 1, True, 16, 8, 2), epilogue)
    assert launch_recipe(d)["abi"] == "gemm_v3"
    t = Target("sm_90a", "fp16", "tn", 16, 28672, 4096, epilogue=epilogue)
    cubin = tmp_path / "k.cubin"
    cubin.write_bytes(b"\x7fELF not really")
    job = kernel_job(t, d, BuildResult(d.key, "a" * 64, True, design_name(d)), TimingConfig(reps=5),
                     str(cubin))  # fmt: skip
    launched = []
    monkeypatch.setattr(worker, "_stream", lambda: 7)
    monkeypatch.setattr(worker, "launch_dense", lambda *a: launched.append(a))
    runs = []
    monkeypatch.setattr(
        worker,
        "_check_and_time",
        lambda job, run, *a, **k: runs.append(run) or JobResult(job, Status.OK),
    )
    worker.run_job(job, 0, "NVIDIA H100 80GB HBM3", correctness.torch_error)
    (run,) = runs
    run(_Tensor(1), _Tensor(2), _Tensor(3), {})
    (args,) = launched
    assert args[3:] == (1, 2, 3, 7, 0, EpilogueArgs(0, 0, ldc, eps))
    from cudal2.verify.launch import dense_gemm

    gemm = dense_gemm(t, 1, 2, 3)
    assert (gemm.n, gemm.ldc) == (28672, ldc)
