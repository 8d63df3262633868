"""On a GPU: the harness rejects every adversarial fixture (tests/verify/fixtures/).

Each fixture cheats in one way that has fooled kernel benchmarks: skipped work, a
partial write, a result cached across calls, NaN output, a race whose every run stays
inside the error bound, an out-of-bounds write, a hang, an illegal address, and work on
another stream. ``fx_honest`` is the control.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from cudal2.records import Job, JobKind, JobResult, Status, Target, TimingConfig

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU"),
    pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc"),
]

TARGET = Target("sm_90a", "fp16", "tn", 100, 136, 264)


@pytest.fixture(scope="module")
def cubin(adversarial) -> tuple[Path, dict]:
    """The fixture kernels' cubin and the recipe they share (tests/verify/conftest.py)."""
    return adversarial


@pytest.fixture(scope="module")
def runner():
    """The runner a build measures through on a GPU: worker processes on device 0."""
    from cudal2.verify.local import LocalRunner

    with LocalRunner(job_timeout_s=30) as r:
        r.start()
        yield r


def _job(cubin: tuple[Path, dict], symbol: str, kind: JobKind = JobKind.MEASURE, **recipe) -> Job:
    """``symbol``'s job, its recipe the fixtures' shared one with ``recipe``'s keys over it."""
    path, shared = cubin
    return Job(
        kind,
        TARGET,
        TimingConfig(reps=5),
        toolchain="fixture",
        artifact_key=f"fixture:{symbol}",
        symbol=symbol,
        recipe={**shared, **recipe},
        cubin=str(path),
    )


def _run(runner, job: Job) -> JobResult:
    (res,) = runner.run([job])
    assert res.job == job
    return res


def test_honest_control_passes(runner, cubin):
    res = _run(runner, _job(cubin, "fx_honest"))
    assert res.status == Status.OK, res.error
    assert len(res.samples_us) == 5 and len(res.baseline_samples_us["torch"]) == 5


@pytest.mark.parametrize(
    "symbol, needle",
    [
        ("fx_skipped_work", "bound"),
        ("fx_partial_write", "not written"),
        ("fx_cached_result", "trial"),
        ("fx_nan_output", "not written (or NaN)"),
        ("fx_racy", "differ bit for bit from the first run"),
    ],
)
def test_wrong_answers_are_incorrect(runner, cubin, symbol, needle):
    res = _run(runner, _job(cubin, symbol))
    assert res.status == Status.INCORRECT, res
    assert needle in res.error and res.samples_us == ()


def test_hang_times_out_and_the_next_candidate_still_runs(runner, cubin):
    hang, honest = runner.run([_job(cubin, "fx_hang"), _job(cubin, "fx_honest")])
    assert hang.status == Status.TIMEOUT and hang.job.symbol == "fx_hang"
    assert honest.status == Status.OK


def test_illegal_address_kills_only_its_worker(runner, cubin):
    before = runner.pool.restarts
    res = _run(runner, _job(cubin, "fx_illegal_address"))
    assert res.status == Status.RUNTIME and "illegal" in res.error.lower()
    assert _run(runner, _job(cubin, "fx_honest")).status == Status.OK
    assert runner.pool.restarts == before + 1


def test_out_of_bounds_write_fails_memcheck(runner, cubin):
    assert _run(runner, _job(cubin, "fx_honest", JobKind.SANITIZE)).status == Status.OK
    bad = _run(runner, _job(cubin, "fx_out_of_bounds", JobKind.SANITIZE))
    assert bad.status == Status.SANITIZER and "Invalid __global__ write" in bad.error


def test_work_on_another_stream_is_below_the_floor():
    from cudal2.bench.bench import below_floor
    from cudal2.hardware import floor_us
    from cudal2.verify.gpu import current_gpu
    from cudal2.verify.timing import TimingConfig, time_interleaved

    t = Target("sm_90a", "fp16", "tn", 4096, 4096, 4096)
    a = torch.randn(t.m, t.k, device="cuda", dtype=torch.float16)
    w = torch.randn(t.n, t.k, device="cuda", dtype=torch.float16)
    c = torch.empty(t.m, t.n, device="cuda", dtype=torch.float16)
    side = torch.cuda.Stream()

    def elsewhere(j):  # the real work goes to a stream the events do not watch
        with torch.cuda.stream(side):
            torch.matmul(a, w.t(), out=c)

    timings = time_interleaved(
        {"honest": lambda j: torch.matmul(a, w.t(), out=c), "other_stream": elsewhere},
        1,
        TimingConfig(reps=5),
        est_us=200.0,
    )
    errors = below_floor(timings, floor_us(t, current_gpu().name))
    assert [e.split(":")[0] for e in errors] == ["other_stream"]


def test_pdl_honest_kernel_passes_the_pair_check(runner, cubin):
    from cudal2.verify.pdl_pair import PAIR_METRIC

    res = _run(runner, _job(cubin, "fx_pdl_honest", pdl=True))
    assert res.status == Status.OK, res.error
    assert res.metrics[PAIR_METRIC] == 1.0


@pytest.mark.parametrize(
    "symbol, needle",
    [
        ("fx_pdl_early_read", "A was read before griddepcontrol.wait"),
        ("fx_pdl_early_write", "written while the kernel before it still ran"),
    ],
)
def test_pdl_kernel_that_does_not_wait_is_rejected_by_the_pair_check(runner, cubin, symbol, needle):
    from cudal2.verify.pdl_pair import PAIR_METRIC

    # Launched plainly it is correct: only the pair check can see the hazard.
    assert _run(runner, _job(cubin, symbol)).status == Status.OK
    res = _run(runner, _job(cubin, symbol, pdl=True))
    assert res.status == Status.INCORRECT, res
    assert "PDL pair check" in res.error and needle in res.error, res.error
    assert res.metrics[PAIR_METRIC] == 0.0 and res.samples_us == ()


# A fused-epilogue (gemm_v3, residual) PDL fixture: its target carries the epilogue, its
# recipe the ABI and boxes (the fixture ignores the tensor maps the launcher encodes).
RESIDUAL_TARGET = Target("sm_90a", "fp16", "tn", 100, 136, 264, epilogue="residual")
RESIDUAL_RECIPE = {"abi": "gemm_v3", "epilogue": "residual", "tma": {"a": [64, 16], "b": [64, 16]}}


def _residual_job(cubin: tuple[Path, dict], symbol: str, pdl: bool = True) -> Job:
    import dataclasses

    job = _job(cubin, symbol, pdl=pdl, **RESIDUAL_RECIPE)
    return dataclasses.replace(job, target=RESIDUAL_TARGET)


def test_pdl_residual_honest_kernel_passes_the_pair_check(runner, cubin):
    from cudal2.verify.pdl_pair import PAIR_METRIC

    res = _run(runner, _residual_job(cubin, "fx_pdl_residual_honest"))
    assert res.status == Status.OK, res.error
    assert res.metrics[PAIR_METRIC] == 1.0
    assert set(res.baseline_samples_us) == {"torch"}


def test_pdl_kernel_reading_the_residual_before_the_wait_is_rejected(runner, cubin):
    from cudal2.verify.pdl_pair import PAIR_METRIC

    # Launched plainly it is correct (the fused op's bound): only the pair check sees it.
    plain = _run(runner, _residual_job(cubin, "fx_pdl_residual_early_read", pdl=False))
    assert plain.status == Status.OK, plain.error
    res = _run(runner, _residual_job(cubin, "fx_pdl_residual_early_read"))
    assert res.status == Status.INCORRECT, res
    assert "PDL pair check" in res.error and "an epilogue operand (residual)" in res.error
    assert res.metrics[PAIR_METRIC] == 0.0 and res.samples_us == ()
