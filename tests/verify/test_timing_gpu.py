"""On a GPU: the one timing function orders work by its real cost and reports spread."""

from __future__ import annotations

import pytest

from cudal2.verify.timing import (
    TimingConfig,
    operand_sets,
    time_interleaved,
    time_sustained,
    time_with_sync,
)

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU"),
]


@pytest.mark.parametrize("mode", ["offline", "server"])
def test_bigger_gemm_takes_longer(mode):
    a = [torch.randn(2048, 2048, device="cuda", dtype=torch.float16) for _ in range(2)]
    b = [torch.randn(8192, 8192, device="cuda", dtype=torch.float16) for _ in range(2)]
    t = time_interleaved(
        {"small": lambda j: a[j] @ a[j], "big": lambda j: b[j] @ b[j]},
        2,
        TimingConfig(reps=15, mode=mode),
        est_us=50.0,
    )
    assert len(t["small"].samples_us) == 15
    assert 0 <= t["big"].spread < 0.5
    if mode == "offline":
        # 64x the FLOPs: at least 20x the time (graph replay hides launch gaps).
        assert t["big"].median_us > 20 * t["small"].median_us
        assert t["small"].calls > 1
    else:
        # After an idle gap the clocks are still ramping (seen on the H100: a 2048^3
        # GEMM took 4x its offline time), so only the order is certain.
        assert t["big"].median_us > 3 * t["small"].median_us
        assert t["small"].calls == 1


def test_rotation_defeats_l2_for_small_operands():
    # 4 MiB operands: one set lives in L2; the rotation must read from HBM, so it is slower.
    nsets = operand_sets(8 * 1024 * 1024)
    src = [torch.empty(4 << 20, dtype=torch.uint8, device="cuda") for _ in range(nsets)]
    dst = [torch.empty_like(s) for s in src]
    cfg = TimingConfig(reps=10)
    hot = time_interleaved({"x": lambda j: dst[0].copy_(src[0])}, 1, cfg, est_us=3.0)["x"]
    cold = time_interleaved({"x": lambda j: dst[j].copy_(src[j])}, nsets, cfg, est_us=3.0)["x"]
    assert cold.median_us > 1.2 * hot.median_us


def test_sync_timing_sees_what_events_see():
    x = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
    ev = time_interleaved({"mm": lambda j: x @ x}, 1, TimingConfig(reps=5), est_us=1500.0)["mm"]
    assert time_with_sync(lambda: x @ x, reps=5) >= 0.9 * ev.median_us


def test_rejects_unknown_mode():
    with pytest.raises(ValueError, match="timing mode"):
        time_interleaved({}, 1, TimingConfig(mode="warp"))


def test_sustained_runs_last_their_seconds_in_windows_of_their_own():
    a = [torch.randn(2048, 2048, device="cuda", dtype=torch.float16) for _ in range(2)]
    b = [torch.randn(8192, 8192, device="cuda", dtype=torch.float16) for _ in range(2)]
    runs = time_sustained(
        {"small": lambda j: a[j] @ a[j], "big": lambda j: b[j] @ b[j]}, 2, seconds=0.3, reps=2
    )
    assert [len(runs["small"]), len(runs["big"])] == [2, 2]
    every = sorted((r for rs in runs.values() for r in rs), key=lambda r: r.t0)
    for r in every:
        # Sized by a warm replay; clocks only fall under sustained load, so runs lengthen.
        assert r.seconds >= 0.8 * 0.3 and r.t1 - r.t0 >= r.seconds * 0.99
    for r, nxt in zip(every, every[1:], strict=False):
        assert r.t1 <= nxt.t0  # the host waited: no two runs share a window
    # 64x the FLOPs: at least 20x the time per call.
    big = min(r.us_per_call for r in runs["big"])
    assert big > 20 * max(r.us_per_call for r in runs["small"])


@pytest.mark.parametrize("slow", [True, False])
def test_a_clearly_slower_candidate_is_stopped_after_five_repetitions(slow):
    """The worker's rule (``clearly_slower``) through the real timing: a candidate doing
    three times torch's work stops after ``STOP_AFTER`` paired repetitions with that
    many samples each; one doing the same work runs all of them."""
    from cudal2.verify.worker import STOP_AFTER, clearly_slower

    a = [torch.randn(4096, 4096, device="cuda", dtype=torch.float16) for _ in range(2)]

    def candidate(j):
        for _ in range(3 if slow else 1):
            a[j] @ a[j]

    seen = []

    def stop(samples):
        seen.append({k: len(v) for k, v in samples.items()})
        return clearly_slower(samples)

    t = time_interleaved(
        {"candidate": candidate, "torch": lambda j: a[j] @ a[j]},
        2,
        TimingConfig(reps=30),
        est_us=200.0,
        stop=stop,
        stop_after=STOP_AFTER,
    )
    assert seen == [{"candidate": STOP_AFTER, "torch": STOP_AFTER}]  # asked once
    want = STOP_AFTER if slow else 30
    assert len(t["candidate"].samples_us) == len(t["torch"].samples_us) == want
    assert (t["candidate"].median_us > 2 * t["torch"].median_us) == slow


def test_settling_runs_the_callables_before_the_first_sample_and_the_clock_holds():
    """``settle_ms``: the callables replayed for that long before any sample, so the
    first repetitions of a power-bound GEMM run at the clock the last ones do."""
    x = [torch.randn(8192, 8192, device="cuda", dtype=torch.float16) for _ in range(2)]
    fns = {"mm": lambda j: x[j] @ x[j]}
    took = {}
    for settle in (0.0, 2000.0):
        phases: dict[str, float] = {}
        cfg = TimingConfig(reps=20, settle_ms=settle)
        t = time_interleaved(fns, 2, cfg, est_us=1500.0, phases=phases)["mm"]
        took[settle] = phases["timing_replay"]
    assert took[2000.0] >= 2.0 > took[0.0]
    first, last = t.samples_us[:5], t.samples_us[-5:]
    assert abs(sorted(first)[2] / sorted(last)[2] - 1) < 0.03, t.samples_us
