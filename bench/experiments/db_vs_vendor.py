"""Best recorded kernel per target of a measurement database against the best vendor
time of a committed bench results file (same GPU, fp16 offline), per family.

    python bench/experiments/db_vs_vendor.py DB.jsonl [BENCH.jsonl] [--family F]

The two come from different runs (and the build times with its own method), so the
"x vendor" ratios are indicative only: the GPU's clocks under load differ from run to
run by several percent. "x torch" is the kernel against torch.matmul timed in the same
process as the kernel (the record's own baseline), the figure selection uses;
`cudal2-bench --kernels` measures every vendor beside a wheel in one process.
"""

from __future__ import annotations

import argparse
import json
import math
from collections import defaultdict
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("db")
    ap.add_argument("bench", nargs="?", default="bench/results/h100-llm-public.jsonl")
    ap.add_argument("--family", action="append")
    args = ap.parse_args()
    vendor = {}
    for line in Path(args.bench).read_text().splitlines():
        r = json.loads(line)
        t = r["target"]
        if r["mode"] == "offline" and t["dtype"] == "fp16" and t["layout"] == "tn":
            vendor[(t["m"], t["n"], t["k"])] = (r["best_vendor"], r["floor_us"])
    best: dict = defaultdict(dict)
    for line in Path(args.db).read_text().splitlines():
        r = json.loads(line)
        t, d = r["target"], r["design"]
        if r["status"] != "ok" or t["dtype"] != "fp16" or t["layout"] != "tn":
            continue
        if d is None:  # a cuBLASLt (vendor) record: no kernel design
            continue
        if args.family and d["family"] not in args.family:
            continue
        key = (t["m"], t["n"], t["k"])
        cur = best[key].get(d["family"])
        if cur is None or r["median_us"] < cur["median_us"]:
            best[key][d["family"]] = r
    ratios, same_run = [], []
    print(
        f"{'MxNxK':>16} {'floor':>6} {'vendor':>16} {'family':>11} {'best us':>8}"
        f" {'x vendor':>8} {'x torch':>8}  design"
    )
    for key in sorted(best):
        if key not in vendor:
            continue
        (bv, floor) = vendor[key]
        fam, r = min(best[key].items(), key=lambda kv: kv[1]["median_us"])
        d = r["design"]
        ratio = bv["median_us"] / r["median_us"]
        ratios.append(ratio)
        vs_torch = r["baselines_us"]["torch"] / r["median_us"]
        same_run.append(vs_torch)
        name = (
            f"{d['bm']}x{d['bn']}x{d['bk']}_w{d['warps_m']}x{d['warps_n']}x{d['warps_k']}"
            f"_s{d['stages']}_sk{d['split_k']}"
        )
        print(
            f"{'x'.join(map(str, key)):>16} {floor:6.2f} {bv['median_us']:7.2f} {bv['name']:>8} "
            f"{fam:>11} {r['median_us']:8.2f} {ratio:8.3f} {vs_torch:8.3f}  {name}"
        )
    if ratios:

        def geomean(xs: list[float]) -> float:
            return math.exp(sum(map(math.log, xs)) / len(xs))

        print(
            f"{len(ratios)} targets: geomean {geomean(ratios):.3f} x best vendor (other run),"
            f" {sum(x > 1 for x in ratios)} faster; {geomean(same_run):.3f} x torch (same"
            f" run), {sum(x > 1 for x in same_run)} faster"
        )


if __name__ == "__main__":
    main()
