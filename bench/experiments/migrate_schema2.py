"""Compute the schema-2 artifact mapping of the committed databases (run once, when
designs became their family plus its own knobs; see cudal2/migrate.py).

For every design in the given files: its schema-2 design (``cudal2.migrate.design_of``);
the cubin the pre-migration code compiled for it (``--old-builds``: design key ->
artifact key, written by compiling every design with an install of the commit before
the migration, into ``--old-cache``); the cubin today's code compiles (``--new-cache``).
An old artifact maps to the new one only where the two cubins' SASS is identical
apart from the kernel's symbol. Writes the mapping (``--out``, gzipped JSON) that
``python -m cudal2.migrate --artifacts`` applies and tests/test_migrate.py checks.

    python bench/experiments/migrate_schema2.py --old-builds old-builds.json \\
        --old-cache OLD_CACHE --new-cache NEW_CACHE --out MAPPING.json.gz FILE...
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import sys
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tqdm import tqdm

from cudal2.generator import design_name, legality
from cudal2.generator.compile import ArtifactCache, build_all
from cudal2.generator.sass import sass
from cudal2.migrate import design_of, old_design_key, read_lines


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--old-builds", required=True)
    p.add_argument("--old-cache", required=True)
    p.add_argument("--new-cache", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("files", nargs="+")
    a = p.parse_args(argv)
    old_builds = json.loads(Path(a.old_builds).read_text())
    old_cache, new_cache = ArtifactCache(Path(a.old_cache)), ArtifactCache(Path(a.new_cache))

    olds: dict[str, dict] = {}  # old design key -> old design JSON
    recorded: dict[str, set[str]] = {}  # old design key -> artifact keys its records name
    for f in a.files:
        for rec in read_lines(Path(f)):
            if rec.get("design") and "knobs" not in rec["design"]:
                key = old_design_key(rec["design"])
                assert rec.get("design_key", key) == key, (f, rec["design_key"])
                olds[key] = rec["design"]
                if "artifact_key" in rec:
                    recorded.setdefault(key, set()).add(rec["artifact_key"])
    news = {k: design_of(d) for k, d in olds.items()}
    legal = {k: d for k, d in news.items() if not legality(d)}
    print(f"{len(olds)} designs, {len(legal)} legal today", flush=True)
    bar = tqdm(total=len(legal), desc="compile (new)", unit="kernel")
    built = build_all(legal.values(), new_cache, a.jobs, on_done=lambda r: bar.update(1))
    bar.close()

    entries: list[dict] = []
    why: Counter[str] = Counter()

    def compare(item: tuple[str, dict]) -> dict:
        key, old = item
        new = news[key]
        e = {
            "old_design": old,
            "old_design_key": key,
            "new_design_key": new.key,
            "old_artifact_key": None,
            "new_artifact_key": None,
            "sass_sha256": None,
            "unmatched": None,
        }
        ob = old_builds.get(key)
        if key not in legal:
            e["unmatched"] = "illegal under today's rules"
        elif ob is None or not ob["ok"]:
            e["unmatched"] = "did not compile before the migration"
        elif not built[new.key].ok:
            e["unmatched"] = "does not compile today"
        else:
            e["old_artifact_key"] = ob["artifact_key"]
            nb = built[new.key]
            old_sass = sass(old_cache.cubin(ob["artifact_key"]), ob["symbol"])
            new_sass = sass(new_cache.cubin(nb.artifact_key), design_name(new))
            if old_sass != new_sass:
                e["unmatched"] = "SASS differs"
            else:
                e["new_artifact_key"] = nb.artifact_key
                e["sass_sha256"] = hashlib.sha256(new_sass.encode()).hexdigest()
        return e

    with ThreadPoolExecutor(a.jobs) as pool:
        for e in tqdm(pool.map(compare, sorted(olds.items())), total=len(olds), desc="SASS"):
            entries.append(e)
            why[e["unmatched"] or "mapped"] += 1
    stale = sum(
        1
        for e in entries
        if e["old_artifact_key"]
        and e["old_artifact_key"] not in recorded.get(e["old_design_key"], {e["old_artifact_key"]})
    )
    print(dict(why), f"({stale} mapped designs' records name another, older artifact)")
    data = json.dumps({"schema": 2, "entries": entries}, sort_keys=True, indent=0).encode()
    Path(a.out).write_bytes(gzip.compress(data, mtime=0))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
