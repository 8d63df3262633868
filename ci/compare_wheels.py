"""Two wheels of one manifest, built before and after a refactor that must not change
what ships: the same table entries (targets, kinds, M ranges, times, speedups) and, for
each kernel entry, the same machine code (SASS identical apart from the symbol name).

    python ci/compare_wheels.py BEFORE.whl AFTER.whl [--json OUT]

Exit 0 when they agree, 1 otherwise (each difference printed).
"""

from __future__ import annotations

import argparse
import json
import sys
import zipfile
from pathlib import Path

from cudal2.generator.sass import sass

# What an entry is and what it was measured to do; names, symbols, cubin hashes and
# design keys may change with a refactor, the rest may not.
SAME = (
    "gpu", "arch", "dtype", "layout", "n", "k", "m_min", "m_max", "m_measured", "kind",
    "time_us", "baseline", "baseline_us", "speedup", "spread", "measured_at", "candidates",
    "launch", "cublaslt",
)  # fmt: skip


def _read(path: Path) -> tuple[dict, dict[str, bytes]]:
    with zipfile.ZipFile(path) as z:
        (name,) = [n for n in z.namelist() if n.endswith("/dispatch.json")]
        table = json.loads(z.read(name))
        cubins = {
            Path(n).stem: z.read(n)
            for n in z.namelist()
            if "/cubins/" in n and n.endswith(".cubin")
        }
    return table, cubins


def _key(e: dict) -> tuple:
    return (e["gpu"], e["arch"], e["dtype"], e["layout"], e["n"], e["k"], e["m_measured"])


def compare(before: Path, after: Path) -> dict:
    (t0, c0), (t1, c1) = _read(before), _read(after)
    e0 = {_key(e): e for e in t0["entries"]}
    e1 = {_key(e): e for e in t1["entries"]}
    problems: list[str] = []
    for k in sorted(set(e0) ^ set(e1)):
        problems.append(f"{k}: only {'before' if k in e0 else 'after'}")
    kernels = same_sass = 0
    for k in sorted(set(e0) & set(e1)):
        a, b = e0[k], e1[k]
        for field in SAME:
            if a.get(field) != b.get(field):
                problems.append(f"{k}: {field} {a.get(field)!r} -> {b.get(field)!r}")
        if a["kind"] == b["kind"] == "kernel":
            kernels += 1
            sa = sass(c0[a["cubin_sha256"]], a["symbol"])
            sb = sass(c1[b["cubin_sha256"]], b["symbol"])
            if sa == sb:
                same_sass += 1
            else:
                problems.append(f"{k}: SASS of {a['kernel']} and {b['kernel']} differ")
    kinds = {}
    for e in t1["entries"]:
        kinds[e["kind"]] = kinds.get(e["kind"], 0) + 1
    return {
        "before": str(before),
        "after": str(after),
        "entries": len(e1),
        "kinds": kinds,
        "kernel_entries": kernels,
        "sass_identical": same_sass,
        "problems": problems,
    }


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("before", type=Path)
    p.add_argument("after", type=Path)
    p.add_argument("--json", type=Path, help="write the comparison here too")
    a = p.parse_args(argv)
    res = compare(a.before, a.after)
    for line in res["problems"]:
        print(line)
    print(
        f"{a.after.name}: {res['entries']} entries {res['kinds']}; "
        f"{res['sass_identical']}/{res['kernel_entries']} kernel entries with identical SASS; "
        f"{len(res['problems'])} differences"
    )
    if a.json:
        a.json.write_text(json.dumps(res, indent=1) + "\n")
    return 1 if res["problems"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
