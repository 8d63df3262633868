"""What the gated baseline costs (docs/kernels.md, "The gated baseline"): per gate_up
shape, torch's ways to compute act(x Wg^T) * (x Wu^T) from a packed weight (gate row j
at 2j, up row j at 2j + 1: ``pack_gate_up``), timed interleaved in one process
(``verify.timing.time_interleaved``: graph replay, operands rotated past L2, warmed up,
medians of the repetitions in random order):

- ``gemm``: the packed GEMM alone, no activation (the floor);
- ``strided``: the packed GEMM, then the activation over its strided halves (the
  baseline and fallback before this experiment);
- ``halves``: a GEMM over ``w[0::2]`` and one over ``w[1::2]`` (views of the packed
  weight), the activation on their contiguous outputs (``correctness.vendor`` and
  ``fused.unfused_gated`` now);
- ``unpacked``: the same over contiguous copies of the two halves (what a model without
  cudal2 runs: its own gate and up weights).

Also per shape: ``halves`` equal to ``unpacked`` bit for bit, its largest difference from
``strided`` (rounding order), and the memory one ``halves`` call allocates beyond its
four [M, N/2] tensors (g, u, act(g), the product): a copy of a weight half would show
there.

    python bench/experiments/gated_baseline.py --out gated-baseline.json
"""

from __future__ import annotations

import json
import statistics

from _interleaved import arguments, summary  # this folder is on sys.path

from cudal2.records import TimingConfig
from cudal2.verify.correctness import act_mul
from cudal2.verify.timing import operand_sets, time_interleaved

# (M, N, K, act): Llama-3.1-8B's gate_up (N = 2 x 14336) at decode batch, prefill Ms
SHAPES = [
    (128, 28672, 4096, "silu"),
    (1024, 28672, 4096, "silu"),
    (2048, 28672, 4096, "silu"),
    (4096, 28672, 4096, "silu"),
    (2048, 28672, 4096, "gelu_tanh"),
]


def _ways(xs, ws, ups, act):
    """Each way as a callable of the operand set's index."""
    import torch

    return {
        "gemm": lambda j: torch.matmul(xs[j], ws[j].t()),
        "strided": lambda j: act_mul(
            *torch.matmul(xs[j], ws[j].t()).unflatten(-1, (-1, 2)).unbind(-1), act
        ),
        "halves": lambda j: act_mul(
            torch.matmul(xs[j], ws[j][0::2].t()), torch.matmul(xs[j], ws[j][1::2].t()), act
        ),
        "unpacked": lambda j: act_mul(
            torch.matmul(xs[j], ups[j][0].t()), torch.matmul(xs[j], ups[j][1].t()), act
        ),
    }


def _extra_bytes(fn, m: int, half: int) -> int:
    """Peak bytes one call allocates beyond its four [m, half] fp16 tensors."""
    import torch

    fn(0)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn(0)
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before - 4 * m * half * 2


def shape_row(m: int, n: int, k: int, act: str, cfg: TimingConfig) -> dict:
    import torch

    g = torch.Generator(device="cuda").manual_seed(m * 7 + n + k)
    nsets = operand_sets((m * k + n * k) * 2)

    def u(*shape, scale):
        return ((torch.rand(*shape, generator=g, device="cuda") * 2 - 1) * scale).half()

    xs = [u(m, k, scale=1.0) for _ in range(nsets)]
    ws = [u(n, k, scale=k**-0.5) for _ in range(nsets)]
    ups = [(w[0::2].contiguous(), w[1::2].contiguous()) for w in ws]
    ways = _ways(xs, ws, ups, act)
    halves, unpacked, strided = (ways[w](0) for w in ("halves", "unpacked", "strided"))
    extra = _extra_bytes(ways["halves"], m, n // 2)
    timed = time_interleaved(ways, nsets, cfg, est_us=2 * m * n * k / 600e6)
    return {
        "m": m,
        "n": n,
        "k": k,
        "act": act,
        "operand_sets": nsets,
        **summary(timed),
        "halves_equal_unpacked": bool(torch.equal(halves, unpacked)),
        "halves_vs_strided_max_abs": float((halves.float() - strided.float()).abs().max()),
        "halves_extra_bytes": extra,
        "weight_half_bytes": n // 2 * k * 2,
    }


def main() -> None:
    import torch

    args, cfg = arguments(__doc__)
    rows = []
    for m, n, k, act in SHAPES:
        rows.append(shape_row(m, n, k, act, cfg))
        med = rows[-1]["median_us"]
        print(
            f"{m}x{n}x{k} {act}: "
            + ", ".join(f"{w} {v:.1f}" for w, v in med.items())
            + f" us; extra {rows[-1]['halves_extra_bytes']} B",
            flush=True,
        )
        torch.cuda.empty_cache()
    doc = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "timing": cfg.as_json(),
        "rows": rows,
        "halves_over_strided_geomean": statistics.geometric_mean(
            r["median_us"]["halves"] / r["median_us"]["strided"] for r in rows
        ),
    }
    args.out.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
