"""Shape files for benchmarks: the formats of ``bench/shapes/*.toml``.

- ``shapes = [[M, N, K], ...]``
- ``tokens = [M, ...]`` with ``[[projection]]`` tables holding parallel lists ``n``
  and ``k`` (and ``name``, ``model``): every token count times every projection.
"""

from __future__ import annotations

import reprlib
import tomllib
from pathlib import Path
from typing import Any

# A shape file is a page of TOML (the 1,000-shape grid is 30 KB).
MAX_SHAPE_FILE_BYTES = 1 << 20
MAX_DIM = 2**31 - 1  # the kernel ABI's C int, as in manifests


class ShapeFileError(ValueError):
    """A shape file that cannot be read; the message names the file and the key."""


def _dim(path: Path, where: str, v: object) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= MAX_DIM:
        raise ShapeFileError(
            f"{path}: {where} = {reprlib.repr(v)}: a dimension must be an integer in [1, {MAX_DIM}]"
        )
    return v


def _read(path: Path) -> dict[str, Any]:
    """The parsed file: a regular file of at most ``MAX_SHAPE_FILE_BYTES`` of TOML."""
    try:
        if not path.is_file():
            reason = "no such shape file" if not path.exists() else "not a regular file"
            raise ShapeFileError(f"{path}: {reason}")
        if path.stat().st_size > MAX_SHAPE_FILE_BYTES:
            raise ShapeFileError(f"{path}: more than {MAX_SHAPE_FILE_BYTES} bytes")
        return tomllib.loads(path.read_bytes().decode("utf-8"))
    except OSError as e:
        raise ShapeFileError(f"{path}: cannot read: {e.strerror or e}") from None
    except RecursionError:
        raise ShapeFileError(f"{path}: arrays or tables nested too deeply") from None
    except ValueError as e:  # not UTF-8, not TOML, a 4300-digit integer
        raise ShapeFileError(f"{path}: {e}") from None


def _list(path: Path, where: str, v: object) -> list[Any]:
    if not isinstance(v, list):
        raise ShapeFileError(f"{path}: {where} = {reprlib.repr(v)}: must be a list")
    return v


def load_shapes(path: str | Path) -> list[tuple[int, int, int]]:
    """(M, N, K) triples in file order, duplicates removed."""
    path = Path(path)
    data = _read(path)
    out: list[tuple[int, int, int]] = []
    for i, s in enumerate(_list(path, "shapes", data.get("shapes", []))):
        if not isinstance(s, list) or len(s) != 3:
            raise ShapeFileError(f"{path}: shapes[{i}] = {reprlib.repr(s)}: expected [M, N, K]")
        out.append(tuple(_dim(path, f"shapes[{i}][{j}]", v) for j, v in enumerate(s)))
    projections = _list(path, "projection", data.get("projection", []))
    if projections:
        tokens = [
            _dim(path, f"tokens[{i}]", t)
            for i, t in enumerate(_list(path, "tokens", data.get("tokens", [])))
        ]
        if not tokens:
            raise ShapeFileError(f"{path}: tokens: required with [[projection]] tables")
        for i, p in enumerate(projections):
            if not isinstance(p, dict):
                raise ShapeFileError(f"{path}: projection[{i}]: must be a table [[projection]]")
            ns = _list(path, f"projection[{i}].n", p.get("n", []))
            ks = _list(path, f"projection[{i}].k", p.get("k", []))
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
