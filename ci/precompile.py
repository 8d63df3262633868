"""Compile the first round's proposals of a manifest into the artifact cache, on a
machine without a GPU, so that the GPU run only measures (carry the cache along).

    CUDAL2_CACHE=.cache/artifacts python ci/precompile.py MANIFEST [MANIFEST...]
"""

from __future__ import annotations

import sys

from tqdm import tqdm

from cudal2.generator.compile import ArtifactCache, build_all
from cudal2.manifest import load_manifest
from cudal2.policy import make_proposer


def main(paths: list[str]) -> int:
    designs = {}
    for path in paths:
        m = load_manifest(path)
        proposer = make_proposer(
            m.search.proposer, m.search.seed, m.search.families, pdl=m.search.pdl
        )
        for t in m.targets:
            for d in proposer.propose(t, [], m.search.candidates):
                designs[d.key] = d
    cache = ArtifactCache()
    bar = tqdm(total=len(designs), desc="compile", unit="kernel")
    results = build_all(designs.values(), cache, on_done=lambda r: bar.update(1))
    bar.close()
    failed = [r for r in results.values() if not r.ok]
    print(f"{len(results)} kernels in {cache.root}; {len(failed)} failed to compile")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
