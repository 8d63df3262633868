"""The correctness suite for a fused epilogue, its logic run on the CPU (operands made
on the CPU, the same code otherwise): the fp32 fused reference, torch's unfused op as
the yardstick, the epilogue operands given to ``run`` fresh per trial, and the checks
that catch a kernel that drops an operand, adds it twice or skips elements."""

from __future__ import annotations

import pytest

from cudal2.records import JobResult, Status, Target
from cudal2.verify import correctness
from cudal2.verify.pdl_pair import _views, packed_offsets

torch = pytest.importorskip("torch")


@pytest.fixture(autouse=True)
def on_cpu(monkeypatch):
    monkeypatch.setattr(correctness, "DEVICE", "cpu")


def _gen(seed: int = 5):
    g = torch.Generator()
    g.manual_seed(seed)
    return g


def _target(epilogue: str, dtype: str = "fp16") -> Target:
    return Target("sm_90a", dtype, "tn", 24, 40, 96, epilogue=epilogue)


def _fused(a, b, c, epi, *, scale=(1.0, 1.0)) -> None:
    """An honest fused kernel: fp32 product, + bias, + residual, one rounding."""
    acc = a.float() @ b.float().t()
    if "bias" in epi:
        acc = acc + scale[0] * epi["bias"].float()
    if "residual" in epi:
        acc = acc + scale[1] * epi["residual"].float()
    c.copy_(acc.to(c.dtype))


EPILOGUES = ["bias", "residual", "bias_residual"]


def _rows(epi: dict) -> dict:
    """The residual without its last row."""
    return {"residual": epi["residual"][:-1]}


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("epilogue", EPILOGUES)
def test_an_honest_fused_kernel_passes(epilogue, dtype):
    seen = []

    def run(a, b, c, epi):
        seen.append({k: v.clone() for k, v in epi.items()})
        _fused(a, b, c, epi)

    res = correctness.check(_target(epilogue, dtype), run, 5)
    assert res.ok, res.error
    assert res.vendors == (f"torch+{epilogue}",)
    # every operand the epilogue reads, fresh each trial (2 random + exact + 2 repeats)
    assert all(set(s) == set(epilogue.split("_")) for s in seen) and len(seen) == 5
    name = "residual" if "residual" in epilogue else "bias"
    # trial 0 and its two repeats share inputs; trial 1 draws fresh ones
    assert torch.equal(seen[0][name], seen[2][name])
    assert not torch.equal(seen[0][name], seen[3][name])


def test_the_unfused_torch_op_rounds_twice_and_stays_within_its_own_bound():
    t = _target("residual")
    a, b = correctness.operands(t, "random", _gen())
    epi = correctness.epilogue_operands(t, "random", _gen(6))
    ref = correctness.reference(t, a, b, epi)
    unfused = correctness.vendor(t, a, b, epi=epi)
    fused = torch.empty_like(unfused)
    _fused(a, b, fused, epi)
    e_unfused = correctness.max_abs_error(unfused, ref)
    e_fused = correctness.max_abs_error(fused, ref)
    assert e_fused <= e_unfused  # one rounding is never worse than two on these inputs
    assert correctness.unfused_error(t, a, b, epi, ref) == {"torch+residual": e_unfused}
    # the reference adds the operands in fp32: not the plain product
    assert not torch.equal(ref, correctness.reference(t, a, b))


@pytest.mark.parametrize(
    ("epilogue", "run", "needle"),
    [
        # drops the operand: far outside the bound
        ("bias", lambda a, b, c, epi: _fused(a, b, c, {}), "bound"),
        ("residual", lambda a, b, c, epi: _fused(a, b, c, {}), "bound"),
        ("bias_residual", lambda a, b, c, epi: _fused(a, b, c, {"bias": epi["bias"]}), "bound"),
        # adds it twice (a split-K kernel whose every rank adds it)
        ("bias", lambda a, b, c, epi: _fused(a, b, c, epi, scale=(2.0, 1.0)), "bound"),
        ("residual", lambda a, b, c, epi: _fused(a, b, c, epi, scale=(1.0, 2.0)), "bound"),
        # leaves the last row unwritten
        ("residual", lambda a, b, c, epi: _fused(a[:-1], b, c[:-1], _rows(epi)), "not written"),
    ],
)  # fmt: skip
def test_a_wrong_epilogue_is_rejected(epilogue, run, needle):
    res = correctness.check(_target(epilogue), run, 5)
    assert not res.ok and needle in res.error, res.error


def test_the_exact_trial_keeps_room_for_the_epilogue():
    """{0,1} operands: the dot products stay 2 below the exact limit, so + bias +
    residual is still an exactly representable integer (bf16: 256)."""
    t = Target("sm_90a", "bf16", "tn", 8, 16, 1024, epilogue="bias_residual")
    a, b = correctness.operands(t, "exact", _gen())
    assert int(a.float().sum(dim=1).max()) == correctness.EXACT_LIMIT["bf16"] - 2
    epi = correctness.epilogue_operands(t, "exact", _gen())
    assert set(torch.unique(epi["bias"].float()).tolist()) <= {0.0, 1.0}
    plain = Target("sm_90a", "bf16", "tn", 8, 16, 1024)
    a, _ = correctness.operands(plain, "exact", _gen())
    assert int(a.float().sum(dim=1).max()) == correctness.EXACT_LIMIT["bf16"]
    assert correctness.epilogue_operands(plain, "random", _gen()) == {}


def test_a_plain_target_keeps_three_argument_runs():
    calls = []

    def run(a, b, c):
        calls.append(1)
        c.copy_((a.float() @ b.float().t()).to(c.dtype))

    assert correctness.check(Target("sm_90a", "fp16", "tn", 8, 16, 64), run, 5).ok
    assert len(calls) == 5


def test_the_pair_checks_activations_share_one_aligned_buffer():
    offsets, total = packed_offsets([24 * 96, 40, 24 * 40])
    assert offsets == [0, 2304, 2344] and total == 2344 + 960
    assert all(o % 8 == 0 for o in offsets)
    offsets, total = packed_offsets([5, 3])
    assert offsets == [0, 8] and total == 16
    buf = torch.arange(total, dtype=torch.float16)
    a, bias = _views(buf, [(5,), (3,)], offsets)
    assert a.tolist() == [0, 1, 2, 3, 4] and bias.tolist() == [8, 9, 10]
    assert bias.data_ptr() - buf.data_ptr() == 16


class _Tensor:
    def __init__(self, ptr: int):
        self.ptr = ptr

    def data_ptr(self) -> int:
        return self.ptr


def test_the_worker_launches_an_epilogue_design_with_its_operands(tmp_path, monkeypatch):
    """The worker's ``run`` gives a gemm_v3 kernel the trial's epilogue operands (the
    residual contiguous: ldr = N); a plain design's gets none."""
    from cudal2.generator import design_name, launch_recipe
    from cudal2.generator.families import base, sm90_tma
    from cudal2.packaging.runtime.abi import EpilogueArgs
    from cudal2.pipeline.results import kernel_job
    from cudal2.records import BuildResult, TimingConfig
    from cudal2.verify import worker

    d = base.with_epilogue(sm90_tma.design("fp16", 1, 1, True, 16, 4, 1), "bias_residual")
    assert launch_recipe(d)["abi"] == "gemm_v3"
    t = Target("sm_90a", "fp16", "tn", 16, 4096, 4096, epilogue="bias_residual")
    build = BuildResult(d.key, "a" * 64, True, design_name(d))
    cubin = tmp_path / "k.cubin"
    cubin.write_bytes(b"\x7fELF not really")
    job = kernel_job(t, d, build, TimingConfig(reps=5), str(cubin))
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
    run(_Tensor(1), _Tensor(2), _Tensor(3), {"bias": _Tensor(4), "residual": _Tensor(5)})
    (args,) = launched
    assert args[3:] == (1, 2, 3, 7, 0, EpilogueArgs(4, 5, 4096))
