"""What torch's RMSNorm costs before a twin's GEMM (``api.NORMED_TWINS``), per prefill
shape: the formula as separate ops (x.float(), pow, mean, rsqrt, product, the rounding:
five kernels or more; how ``fused.rms_normed`` computed it before this experiment, now
``F.rms_norm``), ``torch.nn.functional.rms_norm`` (one fused kernel on CUDA where torch
has it) and a model's own norm (transformers' LlamaRMSNorm: the same ops, then the
weight), timed interleaved in one process (``verify.timing.time_interleaved``: graph
replay, operands rotated past L2), and how often F.rms_norm's output differs from the
ops' (its sum in another order).

    python bench/experiments/rmsnorm_paths.py --out rmsnorm-paths.json
"""

from __future__ import annotations

import json

from _interleaved import arguments, summary  # this folder is on sys.path

from cudal2.records import TimingConfig
from cudal2.verify.timing import operand_sets, time_interleaved

EPS = 1e-5
SHAPES = [(128, 4096), (2048, 4096), (4096, 4096), (2048, 8192)]  # (M, K): tokens, hidden


def _ways(xs, weight):
    import torch
    import torch.nn.functional as F

    def ops(x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)).to(x.dtype)

    return {
        "ops": lambda j: ops(xs[j]),
        "rms_norm": lambda j: F.rms_norm(xs[j], (xs[j].shape[-1],), eps=EPS),
        "model": lambda j: weight * ops(xs[j]),
    }


def row(m: int, k: int, dtype, cfg: TimingConfig) -> dict:
    import torch

    g = torch.Generator(device="cuda").manual_seed(m + k)
    nsets = operand_sets(2 * m * k * 2)
    xs = [(torch.randn(m, k, generator=g, device="cuda") * 3).to(dtype) for _ in range(nsets)]
    weight = (1 + 0.1 * torch.randn(k, generator=g, device="cuda")).to(dtype)
    ways = _ways(xs, weight)
    a, b = ways["ops"](0), ways["rms_norm"](0)
    timed = time_interleaved(ways, nsets, cfg, est_us=5.0)
    return {
        "m": m,
        "k": k,
        "dtype": str(dtype).removeprefix("torch."),
        **summary(timed),
        "rms_norm_differs": int((a != b).sum()),
        "elements": a.numel(),
        "rms_norm_max_abs": float((a.float() - b.float()).abs().max()),
    }


def main() -> None:
    import torch

    args, cfg = arguments(__doc__)
    rows = []
    for dtype in (torch.float16, torch.bfloat16):
        for m, k in SHAPES:
            rows.append(row(m, k, dtype, cfg))
            r = rows[-1]
            print(
                f"{r['dtype']} {m}x{k}: "
                + ", ".join(f"{n} {v:.1f}" for n, v in r["median_us"].items())
                + f" us; {r['rms_norm_differs']} of {r['elements']} differ",
                flush=True,
            )
    doc = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "timing": cfg.as_json(),
        "rows": rows,
    }
    args.out.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
