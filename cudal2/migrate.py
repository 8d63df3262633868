"""Records written by earlier versions, in today's spelling.

Two changes, each named by what changed:

- ``Status.SANITIZER``: before it, a compute-sanitizer memcheck failure was stored as
  status ``runtime`` with an error text starting ``compute-sanitizer memcheck`` (and
  the gate recognised it by that text). Now the status says it. ``upgrade`` turns such
  a record into today's spelling; the database applies it to every record it reads.
- Schema 2: records of schema 1 held flat designs (every family's knobs in one record);
  a design is now its family plus the family's own knobs. Keys, names and sources
  change with it, so this one cannot happen on read: files are rewritten once.

``design_of(old)`` maps a schema-1 design to its schema-2 design, or says why it
cannot. A design's key, name and rendered source change with the schema, so its
artifact key does too; ``python -m cudal2.migrate`` rewrites databases with the new
design, design key and (only where the new cubin's SASS equals the old one's apart
from the symbol name) the new artifact key; see ``docs/contracts.md``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cudal2.records import SCHEMA_VERSION, KernelDesign, Knobs, canonical_json, sha256_hex

LEGACY_SANITIZER_PREFIX = "compute-sanitizer memcheck"


def upgrade(record: dict[str, Any]) -> dict[str, Any]:
    """``record`` (a ``Measurement.as_json`` dict) in today's spelling: a new dict where
    something changed, the same one otherwise (a record already in today's spelling
    passes unchanged)."""
    error = record.get("error") or ""
    if record.get("status") == "runtime" and error.startswith(LEGACY_SANITIZER_PREFIX):
        return {**record, "status": "sanitizer"}
    return record


# The schema-1 fields and their defaults (knobs a family did not have held these).
FLAT_DEFAULTS = {
    "warps_k": 1,
    "split_k": 1,
    "cluster_m": 1,
    "cluster_n": 1,
    "swizzle": 1,
    "persistent": 0,
}
FLAT_FIELDS = ("bm", "bn", "bk", "warps_m", "warps_n", "stages", *FLAT_DEFAULTS)


class NotMappable(ValueError):
    """A schema-1 design that has no schema-2 counterpart (its family ignored a field
    it now has no knob for, so the old design was never what its fields said)."""


def _fixed(old: dict[str, Any], family: str, **want: int) -> None:
    wrong = {k: old[k] for k, v in want.items() if old[k] != v}
    if wrong:
        raise NotMappable(f"{family}: {wrong} has no knob in schema 2 (must be {want})")


def _knobs(old: dict[str, Any]) -> dict[str, int]:
    family = old["family"]
    o = {**FLAT_DEFAULTS, **{k: v for k, v in old.items() if k in FLAT_FIELDS}}
    if family == "sm80mma":
        _fixed(o, family, split_k=1, cluster_m=1, cluster_n=1, swizzle=1, persistent=0)
        return {k: o[k] for k in ("bm", "bn", "bk", "warps_m", "warps_n", "warps_k", "stages")}
    if family in ("sm90csk", "sm90stream"):
        _fixed(o, family, warps_k=1, cluster_m=1, cluster_n=1, swizzle=1, persistent=0)
        return {k: o[k] for k in ("bm", "bn", "bk", "warps_m", "warps_n", "stages", "split_k")}
    if family == "sm90direct":
        _fixed(o, family, warps_m=1, cluster_m=1, cluster_n=1, swizzle=1, persistent=0)
        _fixed(o, family, bn=16 * o["warps_n"])
        return {k: o[k] for k in ("bm", "warps_n", "warps_k", "bk", "stages", "split_k")}
    if family == "sm90wgmma":
        _fixed(o, family, bk=64, warps_n=1, warps_k=1, split_k=1, cluster_m=1, cluster_n=1)
        _fixed(o, family, swizzle=1, persistent=0, bm=16 * o["warps_m"])
        if o["warps_m"] % 4:
            raise NotMappable(f"{family}: warps_m={o['warps_m']} is not whole warpgroups")
        return {"warpgroups": o["warps_m"] // 4, "bn": o["bn"], "stages": o["stages"]}
    if family == "sm90tma":
        _fixed(o, family, bk=64, warps_k=1, cluster_n=1, swizzle=1)
        swap = o["warps_m"] == 1 and o["warps_n"] >= 4
        wg_axis, other = (o["warps_n"], o["warps_m"]) if swap else (o["warps_m"], o["warps_n"])
        if other != 1 or wg_axis % 4:
            raise NotMappable(f"{family}: warps {o['warps_m']}x{o['warps_n']} name no orientation")
        wgs = wg_axis // 4
        p, q = (o["bn"], o["bm"]) if swap else (o["bm"], o["bn"])
        per_block = 64 * (1 if o["persistent"] == 2 else wgs)
        if p % per_block:
            raise NotMappable(f"{family}: {p} rows are not whole 64-row blocks per warpgroup")
        return {
            "swap": int(swap),
            "warpgroups": wgs,
            "m_blocks": p // per_block,
            "wgmma_n": q,
            "stages": o["stages"],
            "split_k": o["split_k"],
            "persistent": o["persistent"],
            "cluster_m": o["cluster_m"],
        }
    raise NotMappable(f"unknown family {family!r}")


def design_of(old: dict[str, Any]) -> KernelDesign:
    """The schema-2 design of a schema-1 design record (raises ``NotMappable``)."""
    unknown = set(old) - {"family", "arch", "dtype", "layout", *FLAT_FIELDS}
    if unknown:
        raise NotMappable(f"unknown schema-1 design fields {sorted(unknown)}")
    return KernelDesign(
        old["family"], old["arch"], old["dtype"], old["layout"], Knobs.of(**_knobs(old))
    )


def old_design_key(old: dict[str, Any]) -> str:
    """The key a schema-1 design had: sha256 of its canonical JSON."""
    return sha256_hex(canonical_json(old))


def read_lines(path: Path) -> Iterator[dict[str, Any]]:
    """The JSON records of a JSON Lines file, gzipped or not (blank lines skipped)."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


@dataclass(frozen=True)
class Mapping:
    """Old design key -> (schema-2 design key, and the new artifact key that replaces
    ``old_artifact_key``, where the two cubins' SASS is the same), as computed once
    by bench/experiments/migrate_schema2.py."""

    entries: dict[str, dict[str, Any]]

    @classmethod
    def load(cls, path: str | Path) -> Mapping:
        data = json.loads(gzip.decompress(Path(path).read_bytes()))
        return cls({e["old_design_key"]: e for e in data["entries"]})

    def artifact(self, old_design_key: str, old_artifact_key: str) -> str | None:
        e = self.entries.get(old_design_key)
        if e and e["new_artifact_key"] and e["old_artifact_key"] == old_artifact_key:
            return e["new_artifact_key"]
        return None


def migrate_record(rec: dict[str, Any], mapping: Mapping | None, why: Counter) -> dict[str, Any]:
    """One record in schema 2. A measurement's artifact key is replaced only where the
    mapping says the new cubin is the old one's machine code; otherwise it keeps the
    old key, so the record still loads but no build ships it (its design no longer
    compiles to that artifact) until it is measured again."""
    rec = upgrade(rec)
    old = rec.get("design")
    if not old or "knobs" in old:
        if "schema_version" in rec:
            rec = {**rec, "schema_version": SCHEMA_VERSION}
        why["no design" if not old else "schema 2 already"] += 1
        return rec
    new = design_of(old)
    out = {**rec, "design": new.as_json()}
    if "design_key" in rec:
        out["design_key"] = new.key
    if "schema_version" in rec:
        out["schema_version"] = SCHEMA_VERSION
    if "artifact_key" in rec:
        key = mapping.artifact(old_design_key(old), rec["artifact_key"]) if mapping else None
        if key is None:
            entry = mapping.entries.get(old_design_key(old)) if mapping else None
            reason = (entry or {}).get("unmatched") or "artifact not today's old artifact"
            why[f"artifact kept: {reason if mapping else 'no mapping given'}"] += 1
        else:
            out["artifact_key"] = key
            why["artifact mapped"] += 1
    else:
        why["design only (no artifact)"] += 1
    return out


def migrate_file(path: Path, mapping: Mapping | None) -> Counter:
    """Rewrite one JSON Lines file (gzipped or not) in schema 2, atomically: a temporary
    file beside it, then a rename; a gzip file is written without a time stamp."""
    why: Counter = Counter()
    lines = [
        json.dumps(migrate_record(rec, mapping, why), sort_keys=True, separators=(",", ":"))
        for rec in read_lines(path)
    ]
    data = "".join(line + "\n" for line in lines).encode("utf-8")
    if path.suffix == ".gz":
        data = gzip.compress(data, mtime=0)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    return why


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m cudal2.migrate",
        description="Rewrite measurement databases (and policy corpora) of schema 1 in "
        "schema 2, in place.",
    )
    p.add_argument(
        "--artifacts",
        help="the artifact mapping (gzipped JSON; the committed databases': "
        "bench/results/migration-schema2.json.gz); without it artifact keys are kept, so "
        "the migrated kernel records must be measured again before they ship",
    )
    p.add_argument("files", nargs="+", type=Path)
    a = p.parse_args(argv)
    mapping = Mapping.load(a.artifacts) if a.artifacts else None
    total: Counter = Counter()
    for path in a.files:
        try:
            why = migrate_file(path, mapping)
        except (OSError, ValueError, KeyError) as e:
            print(f"python -m cudal2.migrate: error: {path}: {e}", file=sys.stderr)
            return 2
        print(f"{path}: " + ", ".join(f"{v} {k}" for k, v in sorted(why.items())))
        total.update(why)
    print("all: " + ", ".join(f"{v} {k}" for k, v in sorted(total.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
