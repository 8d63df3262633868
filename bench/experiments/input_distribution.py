"""Experiment: does a compute-bound GEMM's time on the H100 depend on the input
distribution, or on sustained load before it? (Bench 4096^3 ran 17% slower than an
earlier independent measurement and than the run's own 8192^3 ceiling.)

    python bench/experiments/input_distribution.py   # on the GPU machine

Prints the median of torch.matmul 4096^3 fp16 for uniform(-1,1) and randn operands,
timed in one interleaved call, then again after 5 s of back-to-back GEMMs.
"""

from __future__ import annotations

import time

import torch

from cudal2.verify.timing import TimingConfig, time_interleaved

n = 4096
sets = {
    "uniform(-1,1)": [(torch.rand(n, n, device="cuda") * 2 - 1).half() for _ in range(4)],
    "randn": [torch.randn(n, n, device="cuda").half() for _ in range(4)],
    "randn*0.1": [(torch.randn(n, n, device="cuda") * 0.1).half() for _ in range(4)],
}
out = torch.empty(n, n, device="cuda", dtype=torch.float16)
fns = {
    k: (lambda j, v=v: torch.matmul(v[j % 2], v[2 + j % 2].t(), out=out)) for k, v in sets.items()
}
cfg = TimingConfig(reps=20)
for phase in ("cool", "after 5 s of load"):
    if phase != "cool":
        end = time.time() + 5
        while time.time() < end:
            for _ in range(50):
                fns["randn"](0)
            torch.cuda.synchronize()
    t = time_interleaved(fns, 2, cfg, est_us=180.0)
    print(
        phase,
        {k: round(v.median_us, 1) for k, v in t.items()},
        "TFLOP/s:",
        {k: round(2 * n**3 / v.median_us / 1e6) for k, v in t.items()},
    )
