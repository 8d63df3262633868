"""On a GPU: the one timing function orders work by its real cost and reports spread."""

from __future__ import annotations

import pytest
from cudal2.verify.timing import TimingConfig, time_interleaved

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU"),
]


@pytest.mark.parametrize("mode", ["offline", "server"])
def test_bigger_gemm_takes_longer(mode):
    a = torch.randn(2048, 2048, device="cuda", dtype=torch.float16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
    t = time_interleaved(
        {"small": lambda: a @ a, "big": lambda: b @ b}, TimingConfig(reps=15, mode=mode)
    )
    assert len(t["small"].samples_us) == 15
    assert 0 <= t["big"].spread < 0.5
    if mode == "offline":
        # 64x the FLOPs: at least 20x the time even with launch overhead on the small one.
        assert t["big"].median_us > 20 * t["small"].median_us
    else:
        # After an idle gap the clocks are still ramping (seen on the H100: a 2048^3
        # GEMM took 4x its offline time), so only the order is certain.
        assert t["big"].median_us > 3 * t["small"].median_us


def test_rejects_unknown_mode():
    with pytest.raises(ValueError, match="timing mode"):
        time_interleaved({}, TimingConfig(mode="warp"))
