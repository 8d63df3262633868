"""Compile a selection of issue 22's sm90tma persistent designs of the fp16 and bf16
spaces on the CPU and check their SASS; one JSON line per design, then a summary line;
exit 1 if any design fails.

- ``pair`` (the default; docs/kernels.md "sm90tma v5 pair"): every persistent multicast
  pair: HGMMA, the multicast TMA load (UTMALDG...MULTICAST), no local memory (LDL/STL),
  no spills, the bulk copies (UBLKCP) exactly in the bulk-store designs.
- ``tile_n`` (docs/kernels.md "sm90tma v5 tile N"): every persistent cooperative design
  of a tile N in ``sm90_tma.TILE_N``: HGMMA of that N (``HGMMA.64x<n>x16``), no local
  memory, no spills, the bulk copies.
- ``pingpong`` (docs/kernels.md "sm90tma v5 ping-pong"): every ping-pong design with v5's
  bulk store: HGMMA of its N, no local memory, no spills, the bulk copies, and the
  warpgroup's own named barrier (``BAR.SYNC`` with a register id).

    python ci/pair_sass.py CACHE_DIR [pair|tile_n|pingpong]
"""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path

from tqdm import tqdm

from cudal2.generator import design_name, sass
from cudal2.generator.compile import ArtifactCache, build, checked_cubin
from cudal2.generator.families import sm90_tma
from cudal2.records import KernelDesign


def _pair_facts(d: KernelDesign, listing: str) -> dict[str, bool]:
    return {
        "hgmma": "HGMMA" in listing,
        "multicast": "UTMALDG.2D.MULTICAST" in listing,
        "ublkcp": ("UBLKCP" in listing) == bool(sm90_tma.v5(d, "store")),
    }


def _tile_n_facts(d: KernelDesign, listing: str) -> dict[str, bool]:
    return {
        "hgmma": f"HGMMA.64x{d.knobs.wgmma_n}x16." in listing,
        "ublkcp": ("UBLKCP" in listing) == bool(sm90_tma.v5(d, "store")),
    }


def _pingpong_facts(d: KernelDesign, listing: str) -> dict[str, bool]:
    return {
        **_tile_n_facts(d, listing),
        "own_barrier": re.search(r"BAR\.SYNC(\.DEFER_BLOCKING)? R\d+", listing) is not None,
    }


# selection -> (which persistent designs, the SASS facts each must show, all true)
SELECTIONS: dict[str, tuple[Callable[[KernelDesign], bool], Callable[..., dict[str, bool]]]] = {
    "pair": (lambda d: d.knobs.persistent == 1 and d.knobs.cluster_m == 2, _pair_facts),
    "tile_n": (
        lambda d: d.knobs.persistent == 1 and d.knobs.wgmma_n in sm90_tma.TILE_N,
        _tile_n_facts,
    ),
    "pingpong": (
        lambda d: d.knobs.persistent == 2 and bool(sm90_tma.v5(d, "store")),
        _pingpong_facts,
    ),
}


def main(cache_dir: str, selection: str = "pair") -> int:
    if selection not in SELECTIONS:
        print(f"selection {selection!r}: one of {sorted(SELECTIONS)}", file=sys.stderr)
        return 2
    chosen, facts = SELECTIONS[selection]
    cache = ArtifactCache(Path(cache_dir))
    designs = [
        d for dtype in ("fp16", "bf16") for d in sm90_tma.space("sm_90a", dtype, "tn") if chosen(d)
    ]
    start, bad, regs = time.monotonic(), 0, set()
    for d in tqdm(designs, disable=not sys.stderr.isatty(), file=sys.stderr):
        r = build(d, cache)
        row = {"name": design_name(d), "ok": r.ok, "spill": r.spill_bytes}
        good = r.ok and not r.spill_bytes
        if r.ok:
            listing = sass.sass(checked_cubin(d, cache), r.symbol)
            shown = facts(d, listing)
            local = "LDL" in listing or "STL" in listing
            row.update(regs=r.registers, **shown, local=local)
            regs.add(r.registers)
            good = good and all(shown.values()) and not local
        bad += not good
        print(json.dumps(row), flush=True)
    print(
        f"{len(designs)} {selection} designs, {bad} failing, registers {sorted(regs)}, "
        f"{time.monotonic() - start:.0f} s"
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
