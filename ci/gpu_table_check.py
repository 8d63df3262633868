"""On a GPU: a wheel whose ``dispatch.json`` was tampered with still answers every call
correctly, through the fallback, with one warning naming the problem.

    python ci/gpu_table_check.py WHEEL [--json OUT]

For each tampering in ``TAMPERINGS`` the wheel is unpacked into a fresh folder, its
table is changed, and a fresh interpreter imports the package from there and calls
``linear`` on CUDA tensors of a shape the untampered table runs a kernel for: the result
must equal ``torch.nn.functional.linear`` bit for bit, the stats must name the reason
``table``, and exactly one cudal2 warning must be raised. The untampered wheel is checked
the same way first (it must run the kernel). Exit 1 on any failure.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path


def _first_kernel(table: dict) -> int:
    """The first kernel entry of layout tn (what ``linear`` runs)."""
    return next(
        i for i, e in enumerate(table["entries"]) if e["kind"] == "kernel" and e["layout"] == "tn"
    )


def _set(path: list, value: object) -> Callable[[dict], object]:
    """A tampering that sets ``table[path...] = value`` (an int in the path indexes the
    first kernel entry's position when it is -1)."""

    def edit(table: dict) -> dict:
        node = table
        for key in path[:-1]:
            node = node[_first_kernel(table) if key == -1 else key]
        node[path[-1]] = value
        return table

    return edit


# (name, how the table's JSON text is made from the table)
TAMPERINGS: list[tuple[str, Callable[[dict], object]]] = [
    ("not JSON", lambda t: "{not json"),
    ("format 2", _set(["format"], 2)),
    ("entries not a list", _set(["entries"], {})),
    ("zero tile_m", _set(["entries", -1, "launch", "tile_m"], 0)),
    ("negative tile_n", _set(["entries", -1, "launch", "tile_n"], -64)),
    ("block of 4096 threads", _set(["entries", -1, "launch", "block"], [4096, 1, 1])),
    ("1 GiB of shared memory", _set(["entries", -1, "launch", "smem_bytes"], 1 << 30)),
    ("kernel without a cubin hash", _set(["entries", -1, "cubin_sha256"], None)),
    ("m_min above m_max", _set(["entries", -1, "m_min"], 10**6)),
    (
        "duplicate entry",
        lambda t: {**t, "entries": [*t["entries"], t["entries"][_first_kernel(t)]]},
    ),
]

CHILD = r"""
import importlib, json, sys, warnings
import torch
pkg, dtype, m, n, k = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:6])
dt = {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    mod = importlib.import_module(pkg)
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(m, k, device="cuda", dtype=dt, generator=g)
    w = torch.randn(n, k, device="cuda", dtype=dt, generator=g)
    out = mod.linear(x, w)
    ref = torch.nn.functional.linear(x, w)
    torch.cuda.synchronize()
ours = [str(c.message) for c in caught if pkg in str(c.message)]
print(json.dumps({"equal": bool(torch.equal(out, ref)), "stats": mod.stats.as_dict(),
                  "warnings": ours}))
"""


def _check(root: Path, pkg: str, case: tuple) -> dict:
    env = {**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, pkg, *map(str, case)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tempfile.gettempdir(),
    )
    if proc.returncode != 0:
        return {"error": proc.stderr[-2000:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("wheel", type=Path)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    with zipfile.ZipFile(a.wheel) as z:
        (name,) = [n for n in z.namelist() if n.endswith("/dispatch.json")]
        pkg = name.split("/")[0]
        table = json.loads(z.read(name))
        e = table["entries"][_first_kernel(table)]
        case = (e["dtype"], e["m_measured"], e["n"], e["k"])
        results, failed = [], 0
        for label, tamper in [("untampered", None), *TAMPERINGS]:
            with tempfile.TemporaryDirectory(prefix="cudal2-table-check-") as tmp:
                z.extractall(tmp)
                if tamper is not None:
                    text = tamper(json.loads(z.read(name)))
                    text = text if isinstance(text, str) else json.dumps(text)
                    (Path(tmp) / name).write_text(text)
                got = _check(Path(tmp), pkg, case)
            if tamper is None:
                ok = got.get("equal") is not None and bool(got.get("stats", {}).get("hits"))
            else:
                fallbacks = got.get("stats", {}).get("fallbacks", {})
                ok = (
                    got.get("equal") is True
                    and fallbacks.get("table", 0) >= 1
                    and not got["stats"]["hits"]
                    and len(got.get("warnings", [])) == 1
                )
            failed += not ok
            warning = (got.get("warnings") or [got.get("error", "")])[0][:150]
            results.append({"case": label, "ok": ok, **got})
            print(f"{'ok ' if ok else 'BAD'} {label:28s} {warning}")
    print(f"{len(results)} cases on {e['dtype']}/{e['layout']} {case[1:]}, {failed} failed")
    if a.json:
        a.json.write_text(json.dumps(results, indent=1) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
