"""Shape files for benchmarks: the formats of ``bench/shapes/*.toml``.

- ``shapes = [[M, N, K], ...]``
- ``tokens = [M, ...]`` with ``[[projection]]`` tables holding parallel lists ``n``
  and ``k`` (and ``name``, ``model``): every token count times every projection.
"""

from __future__ import annotations

import tomllib
from pathlib import Path


class ShapeFileError(ValueError):
    """A shape file that cannot be read; the message names the file and the key."""


def _dim(path: Path, where: str, v: object) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ShapeFileError(f"{path}: {where} = {v!r}: a dimension must be a positive integer")
    return v


def load_shapes(path: str | Path) -> list[tuple[int, int, int]]:
    """(M, N, K) triples in file order, duplicates removed."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ShapeFileError(f"{path}: no such shape file") from None
    except tomllib.TOMLDecodeError as e:
        raise ShapeFileError(f"{path}: {e}") from None
    out: list[tuple[int, int, int]] = []
    for i, s in enumerate(data.get("shapes", [])):
        if not isinstance(s, list) or len(s) != 3:
            raise ShapeFileError(f"{path}: shapes[{i}] = {s!r}: expected [M, N, K]")
        out.append(tuple(_dim(path, f"shapes[{i}][{j}]", v) for j, v in enumerate(s)))
    projections = data.get("projection", [])
    if projections:
        tokens = [_dim(path, f"tokens[{i}]", t) for i, t in enumerate(data.get("tokens", []))]
        if not tokens:
            raise ShapeFileError(f"{path}: tokens: required with [[projection]] tables")
        for i, p in enumerate(projections):
            ns, ks = p.get("n", []), p.get("k", [])
            if len(ns) != len(ks) or not ns:
                raise ShapeFileError(
                    f"{path}: projection[{i}]: n and k must be non-empty lists of equal length"
                )
            for j, (n, k) in enumerate(zip(ns, ks, strict=True)):
                for m in tokens:
                    out.append(
                        (
                            m,
                            _dim(path, f"projection[{i}].n[{j}]", n),
                            _dim(path, f"projection[{i}].k[{j}]", k),
                        )
                    )
    if not out:
        raise ShapeFileError(f"{path}: no shapes (expected 'shapes' or 'tokens' + [[projection]])")
    return list(dict.fromkeys(out))
