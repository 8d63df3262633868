"""Check an installed cudal2 kernels wheel on the GPU: every table shape and random
off-table shapes, ``matmul`` and ``linear`` against an fp32 reference.

    python ci/check_wheel.py dist/cudal2_kernels_default-0.1.0-py3-none-any.whl [--json OUT]

The wheel's package must be importable (installed, or on PYTHONPATH). Exit 1 on any
mismatch. Tolerance: output rounding of fp16 / bf16 (2^-11 / 2^-8 of max |ref|, x4
for the accumulation-order difference), the same bound cuBLAS meets.
"""

from __future__ import annotations

import argparse
import importlib
import json
import random
import sys
import zipfile

import torch

TOL = {torch.float16: 4 * 2.0**-11, torch.bfloat16: 4 * 2.0**-8}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("wheel")
    ap.add_argument("--json")
    ap.add_argument("--random-shapes", type=int, default=12)
    args = ap.parse_args()
    with zipfile.ZipFile(args.wheel) as z:
        pkg = next(n.split("/")[0] for n in z.namelist() if n.endswith("/dispatch.json"))
    k = importlib.import_module(pkg)
    k._api.warmup()
    entries = k._api.table.entries
    rng = random.Random(0)
    cases = []
    for e in entries:  # every table shape, at its measured M and just inside its range
        for m in sorted({e.m_measured, e.m_min}):
            cases.append((e.dtype, e.layout, m, e.n, e.k, "table"))
    nk = sorted({(e.n, e.k) for e in entries})
    for _ in range(args.random_shapes):  # off-table: random M on table N,K, and random N,K
        dt, lay = rng.choice(["fp16", "bf16"]), rng.choice(["tn", "nn"])
        n, kk = rng.choice(nk)
        cases.append((dt, lay, rng.randint(1, 3000), n, kk, "off-table M"))
        cases.append(
            (
                dt,
                lay,
                rng.randint(1, 300),
                8 * rng.randint(1, 300),
                8 * rng.randint(1, 300),
                "off-table NK",
            )
        )
    before = dict(k._api.stats.as_dict()["hits"])
    rows, bad = [], 0
    for dt, lay, m, n, kk, why in cases:
        dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[dt]
        a = torch.randn(m, kk, device="cuda", dtype=dtype)
        w = torch.randn(n, kk, device="cuda", dtype=dtype)
        if lay == "tn":
            out, ref = k.linear(a, w), a.float() @ w.float().t()
        else:
            b = w.t().contiguous()  # [K, N] row-major
            out, ref = k.matmul(a, b), a.float() @ b.float()
        torch.cuda.synchronize()
        err = float((out.float() - ref).abs().max()) / max(float(ref.abs().max()), 1e-6)
        ok = out.shape == ref.shape and not torch.isnan(out).any() and err <= TOL[dtype]
        bad += not ok
        rows.append(
            {
                "dtype": dt,
                "layout": lay,
                "m": m,
                "n": n,
                "k": kk,
                "case": why,
                "rel_err": err,
                "ok": bool(ok),
            }
        )
    stats = k._api.stats.as_dict()
    print(f"{'case':13} {'dtype/lay':9} {'M':>5} {'N':>6} {'K':>6}  rel_err   ok")
    for r in rows:
        print(
            f"{r['case']:13} {r['dtype']}/{r['layout']:5} {r['m']:5d} {r['n']:6d} {r['k']:6d}"
            f"  {r['rel_err']:.2e}  {r['ok']}"
        )
    hits = sum(stats.get("hits", {}).values()) - sum(before.values())
    print(
        f"{len(rows)} cases, {bad} failed; kernel hits {hits}, "
        f"fallbacks {dict(stats.get('fallbacks', {}))}"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cases": rows, "failed": bad, "stats": stats}, f, indent=1, default=str)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
