"""The shared skeleton of the SASS experiments (``bench/experiments/sass_*.py``): each
case's design compiled into a scratch artifact cache (under the case's context, e.g. a
patched tag table), its listing counted, one row a case with the registers and spills
its compile reported, written with nvcc's version as the JSON a generated block reads."""

from __future__ import annotations

import argparse
import json
import tempfile
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from cudal2.generator import design_name
from cudal2.generator.compile import ArtifactCache, nvcc_version, sass_listing
from cudal2.records import KernelDesign

Case = tuple[dict[str, Any], KernelDesign, AbstractContextManager]


def main(
    doc: str,
    cases: Callable[[], Iterable[Case]],
    counts: Callable[[str], dict[str, Any]],
    argv: list[str] | None = None,
) -> int:
    """``--out FILE``: one row a case (its fields, the design's name, registers, spills,
    then ``counts`` of its listing) and nvcc's version, as JSON."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        cache = ArtifactCache(Path(tmp))
        for fields, d, context in cases():
            with context:
                listing, r = sass_listing(d, cache)
            rows.append({
                **fields, "design": design_name(d), "registers": r.registers,
                "spill_bytes": r.spill_bytes, **counts(listing),
            })  # fmt: skip
            print(rows[-1])
    args.out.write_text(json.dumps({"nvcc": nvcc_version(), "rows": rows}, indent=1) + "\n")
    return 0
