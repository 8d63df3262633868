"""Why the own prefill kernels trail cuBLASLt under the power limit: per prefill shape,
the fastest own kernel of a sweep's database, cuBLASLt's autotuned algorithm of the same
database and torch.matmul, each run back to back for >= ``--seconds`` (``--reps`` runs
each, interleaved in random order: ``verify.timing.time_sustained``), with the SM clock
and power draw sampled over each run's settled second half (math_ceiling.py's monitor).
At the same power, a kernel slower at the same clock does less work a cycle (its
schedule: bubbles, waits); one slower at a lower clock spends more energy a FLOP (the
bytes it moves, its operands' toggling) (issue 22, docs/kernels.md).

    python bench/experiments/power_own.py --db DB.jsonl.gz [DB ...] --out FILE
        [--shapes bench/shapes/llm-public-prefill.toml] [--seconds 1.5] [--reps 3]

The own kernel: the ok record with a design and the least median per target (fp16 tn,
offline) over the databases, compiled here; cuBLASLt's: the database's autotuned record,
whose heuristic index names the algorithm again (its 64 bytes checked against the
record's). The results file is rewritten (atomically) after every shape.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from math_ceiling import Monitor, gpu_env, runs_json  # noqa: E402

PEAK_TFLOPS = 989.4  # the H100 / H200 SXM datasheet's dense fp16 rate


def best_records(
    paths: list[Path], epilogue: str | None = None
) -> dict[tuple[int, int, int], dict]:
    """Per (M, N, K): the fastest own record ("own") and the cuBLASLt record ("cublaslt");
    ``epilogue``: of that epilogue's targets only (None: of any)."""
    out: dict[tuple[int, int, int], dict] = {}
    for path in paths:
        with gzip.open(path, "rt") if path.suffix == ".gz" else open(path) as f:
            for line in f:
                r = json.loads(line)
                t = r.get("target", {})
                ok = r.get("status") == "ok" and r.get("mode") == "offline"
                if not ok or t.get("dtype") != "fp16":
                    continue
                if epilogue is not None and t.get("epilogue", "none") != epilogue:
                    continue
                key = (t["m"], t["n"], t["k"])
                kind = "own" if r.get("design") else "cublaslt"
                if kind == "cublaslt" and (r.get("vendor") or {}).get("library") != "cublaslt":
                    continue
                slot = out.setdefault(key, {})
                if kind not in slot or r["median_us"] < slot[kind]["median_us"]:
                    slot[kind] = r
    return out


def write_json(path: Path, d: dict) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(d, f, indent=1)
    os.replace(tmp, path)


def own_kernel(design: dict, cache) -> tuple[str, object, dict]:
    """A record's design compiled here (into ``cache``): its name, the loaded kernel and
    its launch recipe."""
    from cudal2.generator.compile import build
    from cudal2.generator.space import design_name, launch_recipe
    from cudal2.packaging.runtime import driver
    from cudal2.records import KernelDesign

    d = KernelDesign.from_json(design)
    b = build(d, cache)
    if not b.ok:
        raise RuntimeError(f"{design_name(d)}: {b.error}")
    recipe = launch_recipe(d)
    return (
        design_name(d),
        driver.Kernel(cache.cubin(b.artifact_key), b.symbol, recipe["smem_bytes"]),
        recipe,
    )


def launch_in_ranges(runs: dict, launches: int) -> None:
    """Each of ``runs`` (name -> a launch) once outside any range (loads, warm-up), then
    ``launches`` times in an NVTX range of its name (``ncu --nvtx-include "<name>/"``),
    synchronised after each."""
    import torch

    for fn in runs.values():
        fn()
    torch.cuda.synchronize()
    for name, fn in runs.items():
        for _ in range(launches):
            with torch.cuda.nvtx.range(name):
                fn()
            torch.cuda.synchronize()


def lt_algo(spread, t, vendor: dict):
    """The target's cuBLASLt problem and the index of a record's algorithm in its
    heuristic list, or None where the list holds other bytes there."""
    lt = spread.problem(t)
    i = int(vendor["heuristic_index"])
    same = i < lt.count and lt.algo_bytes(i).hex() == vendor["algo"]
    return lt, (i if same else None)


def measure_shape(key, recs: dict, spread, cache, mon: Monitor, args) -> dict:
    import torch

    from cudal2.bench.bench import make_operands
    from cudal2.records import Target
    from cudal2.verify.launch import launch_dense
    from cudal2.verify.timing import operand_sets, time_sustained

    m, n, k = key
    t = Target(arch="sm_90a", dtype="fp16", layout="tn", m=m, n=n, k=k)
    nsets = operand_sets(t.min_bytes)
    ops = make_operands(t, nsets, args.seed)
    w_t = [w.t() for w in ops.w_tn]

    def stream() -> int:  # the stream a sustained run's graph is captured on
        return torch.cuda.current_stream().cuda_stream

    fns = {"torch": lambda j: torch.matmul(ops.a[j], w_t[j], out=ops.c[j])}
    rec: dict = {"target": {"m": m, "n": n, "k": k, "dtype": "fp16", "layout": "tn"}}
    own = recs.get("own")
    if own:
        name, kernel, recipe = own_kernel(own["design"], cache)
        fns["own"] = lambda j: launch_dense(
            kernel, recipe, t, ops.a[j].data_ptr(), ops.w_tn[j].data_ptr(), ops.c[j].data_ptr(),
            stream(),
        )  # fmt: skip
        rec["own"] = {"design": name, "record_median_us": own["median_us"]}
    lt_rec = recs.get("cublaslt")
    if lt_rec:
        lt, i = lt_algo(spread, t, lt_rec["vendor"])
        rec["cublaslt"] = {"name": lt_rec["vendor"]["name"], "same_algo": i is not None}
        if i is not None:
            fns["cublaslt"] = lambda j: lt.run(
                i, ops.a[j].data_ptr(), ops.w_tn[j].data_ptr(), ops.c[j].data_ptr(), stream()
            )
    runs = time_sustained(fns, nsets, args.seconds, args.reps, args.seed)
    flops = 2.0 * m * n * k
    rec["operand_sets"] = nsets
    rec["runs"] = {name: runs_json(rs, flops, mon) for name, rs in runs.items()}
    # A rate past the datasheet is work that escaped the timed graph, never a fast kernel.
    fast = [n for n, rs in rec["runs"].items() if max(r["tflops"] for r in rs) > PEAK_TFLOPS]
    if fast:
        raise RuntimeError(f"{key}: {fast} ran faster than {PEAK_TFLOPS} TFLOP/s: not timed")
    return rec


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", nargs="+", type=Path, required=True)
    ap.add_argument("--shapes", default="bench/shapes/llm-public-prefill.toml")
    ap.add_argument("--seconds", type=float, default=1.5)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)

    import torch

    from cudal2.generator.compile import ArtifactCache
    from cudal2.shapes import load_shapes
    from cudal2.verify.spread import VendorSpread

    best = best_records(args.db)
    shapes = [s for s in load_shapes(args.shapes) if tuple(s) in best]
    index = torch.cuda.current_device()
    cache = ArtifactCache(Path(os.environ.get("CUDAL2_CACHE", ".cache/artifacts")))
    spread = VendorSpread()
    res = {
        "env": {**gpu_env(index), "seconds": args.seconds, "reps": args.reps},
        "databases": [str(p) for p in args.db],
        "shapes": [],
    }
    mon = Monitor(index)
    res["env"]["monitor"] = mon.source
    try:
        order = list(shapes)
        random.Random(args.seed).shuffle(order)  # no shape always runs on a cold GPU
        for s in order:
            rec = measure_shape(tuple(s), best[tuple(s)], spread, cache, mon, args)
            res["shapes"].append(rec)
            torch.cuda.empty_cache()
            write_json(args.out, res)
            line = {
                name: (
                    round(sorted(r["tflops"] for r in rs)[len(rs) // 2], 1),
                    round(sorted(r.get("sm_mhz") or 0 for r in rs)[len(rs) // 2]),
                )
                for name, rs in rec["runs"].items()
            }
            print(s, line, flush=True)
    finally:
        mon.stop()
    write_json(args.out, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
