"""Under ncu: a fused database's fastest row-scaled kernel of one target and the same
design without its epilogue (its plain twin: the same tiles, ring and walk), each
launched in an NVTX range of its role ("rows", "plain"), for Nsight Compute's source
counters side by side (issue 22: where the row scale's helper warps cost the consumers
time, docs/kernels.md "sm90tma v5 row scale").

    ncu --nvtx --nvtx-include "rows/" --nvtx-include "plain/" --section ... \\
        python bench/experiments/ncu_row_scale.py --db DB.jsonl.gz --epilogue rmsnorm \\
        --shape 2048 6144 4096

(``ci/gpu_ncu_rows.sh`` runs it so.) A gated epilogue's plain twin is its gated
activation (``rmsnorm_silu`` -> ``silu``, ``records.NORMED_TWINS``), as the selection
compares them. Operands uniform(-1, 1), fp16 tn.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from power_own import best_records, launch_in_ranges, own_kernel  # noqa: E402

from cudal2.records import NORMED_TWINS  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", type=Path, required=True)
    ap.add_argument("--epilogue", default="rmsnorm", choices=sorted(NORMED_TWINS))
    ap.add_argument("--shape", nargs=3, type=int, default=[2048, 6144, 4096])
    ap.add_argument("--launches", type=int, default=1)
    args = ap.parse_args(argv)

    import torch

    from cudal2.generator.compile import ArtifactCache
    from cudal2.generator.families import base
    from cudal2.records import KernelDesign, Target
    from cudal2.verify.launch import dense_epilogue, launch_dense

    m, n, k = args.shape
    twin = NORMED_TWINS[args.epilogue][0]
    rec = best_records([args.db], args.epilogue).get((m, n, k), {}).get("own")
    if rec is None:
        print(
            f"ncu_row_scale.py: {args.db}: no timed fp16 own record of {args.epilogue} at "
            f"{m, n, k}",
            file=sys.stderr,
        )
        return 2
    design = KernelDesign.from_json(rec["design"])
    cache = ArtifactCache(Path(os.environ.get("CUDAL2_CACHE", ".cache/artifacts")))
    a = torch.rand(m, k, device="cuda").mul_(2).sub_(1).half()
    w = torch.rand(n, k, device="cuda").mul_(2).sub_(1).half()
    stream = torch.cuda.current_stream().cuda_stream
    runs = {}
    for role, epi in (("rows", args.epilogue), ("plain", twin)):
        t = Target("sm_90a", "fp16", "tn", m, n, k, epilogue=epi)
        name, kernel, recipe = own_kernel(base.with_epilogue(design, epi).as_json(), cache)
        c = torch.empty(m, t.out_n, device="cuda", dtype=torch.half)

        def run(kernel=kernel, recipe=recipe, t=t, c=c) -> None:
            launch_dense(
                kernel, recipe, t, a.data_ptr(), w.data_ptr(), c.data_ptr(), stream,
                epilogue=dense_epilogue(t),
            )  # fmt: skip

        runs[role] = run
        print(f"{role} ({epi}): {name}")
    launch_in_ranges(runs, args.launches)
    print(f"the database's median of the row-scaled kernel: {rec['median_us']:.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
