"""Compile every sm90tma persistent multicast pair design of the fp16 and bf16 spaces
(issue 22, docs/kernels.md "sm90tma v5 pair") on the CPU and check its SASS: HGMMA,
the multicast TMA load (UTMALDG...MULTICAST), no local memory (LDL/STL), no spills, the
bulk copies (UBLKCP) exactly in the bulk-store designs. One JSON line per design, then
a summary line; exit 1 if any design fails.

    python ci/pair_sass.py CACHE_DIR
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from tqdm import tqdm

from cudal2.generator import design_name, sass
from cudal2.generator.compile import ArtifactCache, build, checked_cubin
from cudal2.generator.families import sm90_tma


def main(cache_dir: str) -> int:
    cache = ArtifactCache(Path(cache_dir))
    designs = [
        d
        for dtype in ("fp16", "bf16")
        for d in sm90_tma.space("sm_90a", dtype, "tn")
        if d.knobs.persistent == 1 and d.knobs.cluster_m == 2
    ]
    start, bad, regs = time.monotonic(), 0, set()
    for d in tqdm(designs, disable=not sys.stderr.isatty(), file=sys.stderr):
        r = build(d, cache)
        row = {"name": design_name(d), "ok": r.ok, "spill": r.spill_bytes}
        if r.ok:
            listing = sass.sass(checked_cubin(d, cache), r.symbol)
            row.update(
                regs=r.registers,
                hgmma="HGMMA" in listing,
                multicast="UTMALDG.2D.MULTICAST" in listing,
                local="LDL" in listing or "STL" in listing,
                ublkcp=("UBLKCP" in listing) == bool(sm90_tma.v5(d, "store")),
            )
            regs.add(r.registers)
        good = r.ok and not r.spill_bytes and row.get("hgmma") and row.get("multicast")
        good = good and not row.get("local") and row.get("ublkcp")
        bad += not good
        print(json.dumps(row), flush=True)
    print(
        f"{len(designs)} pair designs, {bad} failing, registers {sorted(regs)}, "
        f"{time.monotonic() - start:.0f} s"
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
