"""The dispatch table (``dispatch.json``, format 1): which kernel serves which GEMM.

Pure Python: no CUDA, no torch. This file ships inside every generated wheel, so it
imports only the standard library.

Rules (docs/contracts.md): the entries of one (gpu, arch, dtype, layout, n, k),
measured at M1 < M2 < ..., cover ``[1, M1]``, ``[M1+1, M2]``, ...; an M above the
largest measured M is not covered. A GPU model absent from the table is served by
the table's first model (in name order) of the same arch: a stand-in.
"""

from __future__ import annotations

import bisect
from typing import Any

FORMAT = 1

# (gpu, arch, dtype, layout, n, k): one M axis of measured points. The arch is part
# of the key so a model name can never pick up cubins built for another arch.
_Key = tuple[str, str, str, str, int, int]


def entry_key(entry: dict[str, Any]) -> str:
    """A short, stable, human-readable name of one entry (used by the runtime's stats)."""
    return (
        f"{entry['gpu']}/{entry['arch']}/{entry['dtype']}/{entry['layout']}"
        f"/n{entry['n']}/k{entry['k']}/m{entry['m_measured']}"
    )


class DispatchTable:
    """A parsed dispatch table with an index built once, so a lookup is a dict hit
    and a bisect."""

    def __init__(self, meta: dict[str, Any], entries: list[dict[str, Any]]):
        self.meta = meta
        self.entries = entries
        # key -> (sorted m_measured, entries in the same order)
        self._index: dict[_Key, tuple[list[int], list[dict[str, Any]]]] = {}
        self._models: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for entry in entries:
            key = (
                entry["gpu"],
                entry["arch"],
                entry["dtype"],
                entry["layout"],
                int(entry["n"]),
                int(entry["k"]),
            )
            self._index.setdefault(key, ([], []))[1].append(entry)
            self._models.setdefault((entry["gpu"], entry["arch"]), []).append(entry)
        for key, (ms, group) in self._index.items():
            # Trust m_measured, not the file order (the contract sorts by m_min, which
            # gives the same order for a well-formed table, but costs nothing to redo).
            group.sort(key=lambda e: int(e["m_measured"]))
            ms.extend(int(e["m_measured"]) for e in group)
            for lo, hi in zip(ms, ms[1:], strict=False):
                if lo == hi:
                    raise ValueError(f"dispatch table: two entries for {key} measured at M={lo}")
        # arch -> the model that stands in for unknown models of that arch
        self._stand_in: dict[str, str] = {}
        for gpu, arch in sorted(self._models):
            self._stand_in.setdefault(arch, gpu)
        self._resolved: dict[tuple[str, str], tuple[str | None, bool]] = {}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> DispatchTable:
        """Parse a loaded ``dispatch.json``; raises ValueError for another format."""
        if d.get("format") != FORMAT:
            raise ValueError(
                f"dispatch table format {d.get('format')!r} is not supported "
                f"(this runtime reads format {FORMAT})"
            )
        meta = {key: value for key, value in d.items() if key != "entries"}
        return cls(meta, list(d.get("entries") or []))

    @property
    def archs(self) -> list[str]:
        """Archs that have entries, sorted."""
        return sorted({arch for _, arch in self._models})

    @property
    def gpu_models(self) -> list[str]:
        """GPU models that have entries, sorted."""
        return sorted({gpu for gpu, _ in self._models})

    @property
    def cuda_versions(self) -> list[str]:
        """CUDA versions the kernels were measured under (``meta["cuda_versions"]``)."""
        return list(self.meta.get("cuda_versions") or [])

    def resolve_gpu(self, gpu: str, arch: str) -> tuple[str | None, bool]:
        """The table's model that serves ``gpu`` of ``arch``, and whether it is a
        stand-in: ``(gpu, False)`` on an exact match, ``(first model of that arch,
        True)`` otherwise, ``(None, False)`` when the table has nothing for ``arch``."""
        key = (gpu, arch)
        got = self._resolved.get(key)
        if got is None:
            if key in self._models:
                got = (gpu, False)
            elif arch in self._stand_in:
                got = (self._stand_in[arch], True)
            else:
                got = (None, False)
            self._resolved[key] = got
        return got

    def lookup(
        self, gpu: str, arch: str, dtype: str, layout: str, m: int, n: int, k: int
    ) -> dict[str, Any] | None:
        """The entry serving this GEMM on ``gpu`` (stand-in models allowed; see
        ``resolve_gpu``), or None when it is not covered. The entry may be of kind
        ``fallback``: then the table says the baseline is the best choice."""
        model, _ = self.resolve_gpu(gpu, arch)
        if model is None:
            return None
        return self.lookup_exact(model, arch, dtype, layout, m, n, k)

    def lookup_exact(
        self, gpu: str, arch: str, dtype: str, layout: str, m: int, n: int, k: int
    ) -> dict[str, Any] | None:
        """Like ``lookup`` but for a model already resolved (no stand-in search)."""
        found = self._index.get((gpu, arch, dtype, layout, n, k))
        if found is None or m < 1:
            return None
        ms, group = found
        # The entry measured at the nearest M at or above m covers m.
        i = bisect.bisect_left(ms, m)
        return group[i] if i < len(ms) else None

    def entries_for(self, gpu: str, arch: str) -> list[dict[str, Any]]:
        """Every entry of one model and arch (exact model name, no stand-in)."""
        return list(self._models.get((gpu, arch), ()))
