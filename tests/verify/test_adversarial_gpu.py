"""On a GPU: the harness rejects every adversarial fixture (tests/verify/fixtures/).

Each fixture cheats in one way that has fooled kernel benchmarks: skipped work, a
partial write, a result cached across calls, NaN output, a race whose every run stays
inside the error bound, an out-of-bounds write, a hang, an illegal address, and work on
another stream. ``fx_honest`` is the control.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from cudal2.records import Target

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU"),
    pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc"),
]

SOURCE = Path(__file__).parent / "fixtures" / "adversarial.cu"
RECIPE = {
    "abi": "gemm_v1",
    "block": [256, 1, 1],
    "tile_m": 16,
    "tile_n": 16,
    "split_k": 1,
    "cluster": [1, 1, 1],
    "smem_bytes": 0,
    "align": {"k": 8},
}
TARGET = Target("sm_90a", "fp16", "tn", 100, 136, 264)


@pytest.fixture(scope="module")
def cubin(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("adversarial") / "adversarial.cubin"
    subprocess.run(
        [
            "nvcc",
            "-cubin",
            "-gencode=arch=compute_90a,code=sm_90a",
            "-O2",
            "-o",
            str(out),
            str(SOURCE),
        ],
        check=True,
    )
    return out


@pytest.fixture(scope="module")
def pool():
    from cudal2.verify.pool import WorkerPool

    with WorkerPool(job_timeout_s=30) as p:
        yield p


def _job(cubin: Path, symbol: str) -> dict:
    return {
        "target": TARGET.as_json(),
        "cubin_path": str(cubin),
        "symbol": symbol,
        "recipe": RECIPE,
        "timing": {"reps": 5, "mode": "offline"},
    }


def test_honest_control_passes(pool, cubin):
    res = pool.run(_job(cubin, "fx_honest"))
    assert res["status"] == "ok", res.get("error")


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
def test_wrong_answers_are_incorrect(pool, cubin, symbol, needle):
    res = pool.run(_job(cubin, symbol))
    assert res["status"] == "incorrect", res
    assert needle in res["error"]


def test_hang_times_out_and_the_next_candidate_still_runs(pool, cubin):
    res = pool.run(_job(cubin, "fx_hang"))
    assert res["status"] == "timeout"
    assert pool.run(_job(cubin, "fx_honest"))["status"] == "ok"


def test_illegal_address_kills_only_its_worker(pool, cubin):
    before = pool.restarts
    res = pool.run(_job(cubin, "fx_illegal_address"))
    assert res["status"] == "runtime" and "illegal" in res["error"].lower()
    assert pool.run(_job(cubin, "fx_honest"))["status"] == "ok"
    assert pool.restarts == before + 1


def test_out_of_bounds_write_fails_memcheck(cubin):
    from cudal2.verify.sanitizer import memcheck

    assert memcheck(cubin, "fx_honest", RECIPE, TARGET).ok
    bad = memcheck(cubin, "fx_out_of_bounds", RECIPE, TARGET)
    assert not bad.ok and "Invalid __global__ write" in bad.report


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
