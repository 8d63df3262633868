"""Comparing two dispatch tables (e.g. two releases of one kernel wheel), and the gate.

Entries are matched by identity, ``TableEntry.key``: (gpu, arch, dtype, layout, n, k,
m_measured). A target only in the new table is *added*, only in the old one *removed*.
A matched target is *changed* when its kernel (or cuBLASLt algorithm) was swapped, it
moved between kernel, cuBLASLt algorithm and fallback, what runs changed under the same
name (a kernel's cubin bytes or launch recipe, a cuBLASLt algorithm's bytes or library
version), its eager alternative appeared, went or changed, or what cudal2 controls
got slower or faster by more than the noise threshold.

What cudal2 controls is the shipped entry's time *relative to its own same-run baseline*
(``time_us / baseline_us``: both medians of one measuring run, so a GPU that is slower
on one day moves both), or, where an entry has no baseline, the kernel's own time. A
fallback entry's time is the baseline's own (torch's), which cudal2 does not control: a
fallback -> fallback move of it is *noise*, listed apart and never a regression.

The gate (``gate_failures``): a target removed, or moved from a kernel or cuBLASLt entry
to the fallback, fails it unless removals are allowed; a kernel or cuBLASLt entry
relatively slower by more than ``regression_pct`` fails it (a *regression*). Since the
GPU model is part of the match, only measurements of one GPU model are ever compared.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from .runtime.table import DispatchTable, TableEntry

# Reason codes of a changed row (``reasons``), in the order they are reported.
KERNEL_SWAPPED = "kernel_swapped"
TO_FALLBACK = "to_fallback"
TO_KERNEL = "to_kernel"
TO_CUBLASLT = "to_cublaslt"
CUBIN_CHANGED = "cubin_changed"
LAUNCH_CHANGED = "launch_changed"
ALGO_CHANGED = "algo_changed"
# An entry's eager alternative (``TableEntry.eager``) appeared, went, or is another
# kernel (or the same name with other cubin bytes or launch recipe).
EAGER_ADDED = "eager_added"
EAGER_REMOVED = "eager_removed"
EAGER_CHANGED = "eager_changed"
SLOWER = "slower"
FASTER = "faster"
# A fallback -> fallback target whose (torch's) time moved past the noise: not a change.
BASELINE_MOVED = "baseline_moved"

# Why a row fails the gate (``gate`` of a row in ``gate_failures``).
GATE_REMOVED = "removed"
GATE_TO_FALLBACK = "to_fallback"
GATE_SLOWER = "slower"

REASON_LABELS = {
    KERNEL_SWAPPED: "swapped",
    TO_FALLBACK: "->fallback",
    TO_KERNEL: "->kernel",
    TO_CUBLASLT: "->cublaslt",
    CUBIN_CHANGED: "cubin changed",
    LAUNCH_CHANGED: "launch changed",
    ALGO_CHANGED: "algorithm changed",
    EAGER_ADDED: "+eager alternative",
    EAGER_REMOVED: "-eager alternative",
    EAGER_CHANGED: "eager alternative changed",
    BASELINE_MOVED: "torch time moved",
}


@dataclass(frozen=True)
class DiffResult:
    """The difference between two tables; every row is a plain JSON-ready dict.

    Each row has ``change`` ("added", "removed", "changed", "noise" or "unchanged"), the
    target (``gpu``, ``arch``, ``dtype``, ``layout``, ``m`` = m_measured, ``n``, ``k``),
    ``m_range`` (the M range dispatched: the new entry's, or the old one's if removed),
    ``before`` and ``after`` (``{"kind", "kernel", "label", "cubin_sha256", "m_range",
    "time_us", "baseline_us", "speedup"}`` or null where the target is absent),
    ``time_pct`` (percent change of time_us, positive = slower; null unless matched),
    ``rel_pct`` (percent change of what cudal2 controls: time relative to the same-run
    baseline, or the kernel's own time without one; 0 for fallback -> fallback; null
    unless matched) and ``reasons`` (codes, see module).

    ``regressions``: matched rows shipping a kernel or cuBLASLt entry after, relatively
    slower by more than ``regression_pct``. ``noise``: fallback -> fallback rows whose
    baseline time moved by more than ``noise_pct``.
    """

    added: list[dict[str, Any]]
    removed: list[dict[str, Any]]
    changed: list[dict[str, Any]]
    regressions: list[dict[str, Any]]
    noise: list[dict[str, Any]]
    noise_pct: float
    regression_pct: float
    # Every matched target, changed or not, so other thresholds can be asked later.
    matched: list[dict[str, Any]] = field(default_factory=list, repr=False)
    old_count: int = 0
    new_count: int = 0

    @property
    def empty(self) -> bool:
        """True when nothing was added, removed or changed (noise is no change)."""
        return not (self.added or self.removed or self.changed)

    @property
    def to_fallback(self) -> list[dict[str, Any]]:
        """Matched rows that shipped a kernel or cuBLASLt entry and now fall back."""
        return [row for row in self.changed if TO_FALLBACK in row["reasons"]]

    @property
    def gpu_models(self) -> list[str]:
        """The GPU models of every row, sorted."""
        rows = (*self.added, *self.removed, *self.matched)
        return sorted({row["gpu"] for row in rows})

    def regressions_over(self, pct: float) -> list[dict[str, Any]]:
        """Matched rows shipping a kernel or cuBLASLt entry whose controlled time
        (``rel_pct``) got slower by more than ``pct`` percent."""
        return [row for row in self.matched if _is_regression(row, pct)]

    def gate_failures(self, allow_removed: bool = False) -> list[dict[str, Any]]:
        """The rows that fail the release gate at ``regression_pct``, each a copy with
        ``gate`` set to why: ``removed``, ``to_fallback`` (both passed by
        ``allow_removed``) or ``slower``. In the order removed, to_fallback, slower."""
        failures: list[dict[str, Any]] = []
        if not allow_removed:
            failures += [dict(row, gate=GATE_REMOVED) for row in self.removed]
            failures += [dict(row, gate=GATE_TO_FALLBACK) for row in self.to_fallback]
        failures += [dict(row, gate=GATE_SLOWER) for row in self.regressions]
        return failures

    def as_json(self) -> dict[str, Any]:
        """``{"added", "removed", "changed", "regressions", "noise"}`` as lists of row
        dicts (the CLI adds ``gate``)."""
        return {
            "added": [dict(r) for r in self.added],
            "removed": [dict(r) for r in self.removed],
            "changed": [dict(r) for r in self.changed],
            "regressions": [dict(r) for r in self.regressions],
            "noise": [dict(r) for r in self.noise],
        }


def diff_tables(
    old: DispatchTable,
    new: DispatchTable,
    noise_pct: float = 2.0,
    regression_pct: float | None = None,
) -> DiffResult:
    """Compare two format-1 tables.

    ``noise_pct``: a move of at most this many percent does not make a target
    "changed" (nor a fallback's time "noise"). ``regression_pct``: how much slower, in
    controlled time, a kernel or cuBLASLt entry must get to count as a regression;
    defaults to ``noise_pct``.
    """
    for name, value in (("noise_pct", noise_pct), ("regression_pct", regression_pct)):
        if value is not None and not value >= 0:  # also refuses nan
            raise ValueError(f"{name} must be >= 0, got {value}")
    if regression_pct is None:
        regression_pct = noise_pct
    before = {e.key: e for e in old.entries}
    after = {e.key: e for e in new.entries}

    added, removed, changed, noise, matched = [], [], [], [], []
    for key in sorted(before.keys() | after.keys()):
        b, a = before.get(key), after.get(key)
        if b is None:
            added.append(_row("added", a, None, a))
        elif a is None:
            removed.append(_row("removed", b, b, None))
        else:
            row = _matched_row(b, a, noise_pct)
            matched.append(row)
            if row["change"] == "changed":
                changed.append(row)
            elif row["change"] == "noise":
                noise.append(row)
    return DiffResult(
        added=added,
        removed=removed,
        changed=changed,
        regressions=[row for row in matched if _is_regression(row, regression_pct)],
        noise=noise,
        noise_pct=noise_pct,
        regression_pct=regression_pct,
        matched=matched,
        old_count=len(old.entries),
        new_count=len(new.entries),
    )


def _is_regression(row: dict[str, Any], pct: float) -> bool:
    # A move to the fallback is the gate's "to_fallback", not a slowdown of an entry.
    return row["after"]["kind"] != "fallback" and row["rel_pct"] > pct


def _summary(entry: TableEntry) -> dict[str, Any]:
    out = {
        "kind": entry.kind,
        "kernel": entry.kernel,
        "label": entry.label,
        "cubin_sha256": entry.cubin_sha256,
        "m_range": entry.m_range,
        "time_us": entry.time_us,
        "baseline_us": entry.baseline_us,
        "speedup": entry.speedup,
    }
    if entry.eager is not None:  # only where present: older reports stay as they were
        out["eager"] = {
            "kernel": entry.eager.kernel,
            "cubin_sha256": entry.eager.cubin_sha256,
            "time_us": entry.eager.time_us,
        }
    return out


def _row(
    change: str,
    entry: TableEntry,
    before: TableEntry | None,
    after: TableEntry | None,
    time_pct: float | None = None,
    rel_pct: float | None = None,
    reasons: list[str] | None = None,
) -> dict[str, Any]:
    return {
        "change": change,
        "gpu": entry.gpu,
        "arch": entry.arch,
        "dtype": entry.dtype,
        "layout": entry.layout,
        "m": entry.m_measured,
        "m_range": entry.m_range,
        "n": entry.n,
        "k": entry.k,
        "before": _summary(before) if before is not None else None,
        "after": _summary(after) if after is not None else None,
        "time_pct": time_pct,
        "rel_pct": rel_pct,
        "reasons": list(reasons or []),
    }


def _relative(entry: TableEntry) -> float | None:
    """The entry's time over its same-run baseline's (1 for a fallback); None without
    a baseline time."""
    if entry.kind == "fallback":
        return 1.0
    if entry.baseline_us is None or entry.baseline_us <= 0:
        return None
    return entry.time_us / entry.baseline_us


def _rel_pct(b: TableEntry, a: TableEntry, time_pct: float) -> float:
    """Percent change of what cudal2 controls (positive = slower)."""
    if b.kind == a.kind == "fallback":
        return 0.0  # torch's time against itself: nothing of cudal2's moved
    rb, ra = _relative(b), _relative(a)
    if rb is None or ra is None:
        return time_pct  # no same-run baseline on one side: the kernel's own time
    return (ra - rb) / rb * 100.0


def _matched_row(b: TableEntry, a: TableEntry, noise_pct: float) -> dict[str, Any]:
    reasons: list[str] = []
    if b.kind != a.kind:
        reasons.append({"fallback": TO_FALLBACK, "cublaslt": TO_CUBLASLT}.get(a.kind, TO_KERNEL))
    elif b.kind != "fallback" and b.kernel != a.kernel:
        reasons.append(KERNEL_SWAPPED)
    else:
        reasons.extend(_same_name_changes(b, a))
    reasons.extend(_eager_changes(b, a))
    time_pct = (a.time_us - b.time_us) / b.time_us * 100.0
    rel_pct = _rel_pct(b, a, time_pct)
    if abs(rel_pct) > noise_pct:
        reasons.append(SLOWER if rel_pct > 0 else FASTER)
    if reasons:
        change = "changed"
    elif b.kind == "fallback" and abs(time_pct) > noise_pct:
        change, reasons = "noise", [BASELINE_MOVED]
    else:
        change = "unchanged"
    return _row(change, a, b, a, time_pct=time_pct, rel_pct=rel_pct, reasons=reasons)


def _same_name_changes(b: TableEntry, a: TableEntry) -> list[str]:
    """What changed in what runs, for two entries of one kind and one kernel name."""
    if b.kind == "kernel":
        return [
            reason
            for reason, changed in (
                (CUBIN_CHANGED, b.cubin_sha256 != a.cubin_sha256),
                (LAUNCH_CHANGED, b.launch != a.launch),
            )
            if changed
        ]
    if b.kind == "cublaslt" and b.cublaslt != a.cublaslt:
        return [ALGO_CHANGED]
    return []


def _eager_changes(b: TableEntry, a: TableEntry) -> list[str]:
    """How the eager alternative moved between two matched entries (at most one code)."""
    if b.eager is None and a.eager is None:
        return []
    if b.eager is None:
        return [EAGER_ADDED]
    if a.eager is None:
        return [EAGER_REMOVED]
    same = (b.eager.kernel, b.eager.cubin_sha256, b.eager.launch) == (
        a.eager.kernel,
        a.eager.cubin_sha256,
        a.eager.launch,
    )
    return [] if same else [EAGER_CHANGED]


def change_label(row: dict[str, Any], short: bool = False) -> str:
    """A row's change in words: ``removed``, ``->cublaslt, slower +12.6%``, ...
    ``short`` (text): a move's percent follows the other reasons without its word,
    ``->cublaslt +12.6%``."""
    if row["change"] in ("added", "removed"):
        return row["change"]
    labels, moved = [], ""
    for reason in row["reasons"]:
        if reason in (SLOWER, FASTER):
            moved = f"{row['rel_pct']:+.1f}%"
            labels.append(f"{reason} {moved}")
        elif reason == BASELINE_MOVED:
            labels.append(f"torch {row['time_pct']:+.1f}%")
        else:
            labels.append(REASON_LABELS[reason])
    if short and moved and len(labels) > 1:
        return " ".join([*labels[:-1], moved])
    return ", ".join(labels) or f"{row['rel_pct']:+.1f}%"


def row_order(row: dict[str, Any]) -> tuple[Any, ...]:
    """Rows in the order of the build's table: (gpu, dtype, layout, n, k, m)."""
    return (row["gpu"], row["dtype"], row["layout"], row["n"], row["k"], row["m"])


# -- reports ------------------------------------------------------------------------------
# Text (a terminal, a log) and markdown (a pull request) show the same sections, in the
# same order, with the build table's names (``TableEntry.label``) and M ranges.


@dataclass(frozen=True)
class GateSettings:
    """How the CLI gates: armed by ``--fail-on-regression`` (``regression_pct`` of the
    result), removals passed by ``--allow-removed``."""

    armed: bool = False
    allow_removed: bool = False


def sections(result: DiffResult) -> list[tuple[str, list[dict[str, Any]]]]:
    """The report's sections, each (title, rows in the build table's order): removed,
    moved to the fallback, slower (the regressions), other changes, added, and the
    fallback -> fallback noise. A row appears in one section only."""
    to_fallback = result.to_fallback
    taken = {id(r) for r in to_fallback}
    slower = [r for r in result.regressions if id(r) not in taken]
    taken |= {id(r) for r in slower}
    others = [r for r in result.changed if id(r) not in taken]
    pct = f"{result.regression_pct:g}%"
    named = [
        ("removed", result.removed),
        ("moved to the fallback", to_fallback),
        (f"slower by more than {pct} relative to the same-run baseline", slower),
        ("other changes", others),
        ("added", result.added),
        ("noise: the fallback's own (torch's) time moved, not a change", result.noise),
    ]
    return [(title, sorted(rows, key=row_order)) for title, rows in named if rows]


def counts_line(result: DiffResult) -> str:
    """The counts, most important first, on two short lines."""
    return (
        f"{result.old_count} -> {result.new_count} targets: {len(result.removed)} removed, "
        f"{len(result.to_fallback)} moved to the fallback, {len(result.regressions)} slower "
        f"by more than {result.regression_pct:g}%\n{len(result.changed)} changed, "
        f"{len(result.added)} added, {len(result.noise)} fallback time moves "
        f"(noise {result.noise_pct:g}%)"
    )


def gate_line(result: DiffResult, gate: GateSettings) -> str:
    """The gate's verdict in one line, or "" when it is not armed."""
    if not gate.armed:
        return ""
    failures = result.gate_failures(gate.allow_removed)
    if not failures:
        allowed = " (removals allowed)" if gate.allow_removed else ""
        return f"gate: passed at {result.regression_pct:g}%{allowed}"
    why = {GATE_REMOVED: 0, GATE_TO_FALLBACK: 0, GATE_SLOWER: 0}
    for row in failures:
        why[row["gate"]] += 1
    parts = [f"{n} {reason.replace('_', ' ')}" for reason, n in why.items() if n]
    return f"gate: FAILED at {result.regression_pct:g}%: " + ", ".join(parts)


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _plain(text: str, markdown: bool) -> str:
    """A name from a table as one cell: control characters (a newline would end the
    row) as ``?``; for markdown also the pipe (it would end the cell) escaped and HTML
    brackets (a ``<details>`` of the table's own) as entities."""
    text = _CONTROL.sub("?", text)
    if markdown:
        text = text.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")
    return text


def _code(text: str) -> str:
    """A name as a markdown code span: inside one, brackets are already literal; a
    backtick would end it early, so it becomes a quote."""
    return "`" + _CONTROL.sub("?", text).replace("`", "'").replace("|", "\\|") + "`"


def _cells(row: dict[str, Any], with_gpu: bool, markdown: bool = False) -> list[str]:
    """One row's cells: change, [gpu,] dtype/layout, M, N, K, before, after, time,
    speedup; for ``markdown`` the names are code spans (text is kept short)."""
    arrow = "→" if markdown else "->"

    def name(side: dict[str, Any] | None) -> str:
        if side is None:
            return "-"
        return _code(side["label"]) if markdown else _plain(side["label"], False)

    def pair(key: str, fmt: str) -> str:
        # one value where both sides agree or one side is absent (added, removed)
        one = [
            "-" if s is None or s[key] is None else format(s[key], fmt)
            for s in (row["before"], row["after"])
            if s is not None
        ]
        return one[0] if len(set(one)) == 1 else f"{one[0]} {arrow} {one[1]}"

    cells = [change_label(row, short=not markdown)]
    if with_gpu:
        cells.append(_plain(row["gpu"].removeprefix("NVIDIA "), markdown))
    kind = _plain(f"{row['dtype']}/{row['layout']}", markdown)
    cells += [kind, row["m_range"], str(row["n"]), str(row["k"])]
    cells += [name(row["before"]), name(row["after"]), pair("time_us", ".2f")]
    cells.append(pair("speedup", ".3f"))
    return cells


def _header(with_gpu: bool, time_unit: str) -> list[str]:
    head = ["change", *(["gpu"] if with_gpu else []), "dtype/layout", "M", "N", "K"]
    return [*head, "before", "after", f"time {time_unit}", "speedup"]


def render_text(result: DiffResult, gate: GateSettings | None = None, max_rows: int = 20) -> str:
    """The report for a terminal or a log: counts, the gate's verdict, then each
    section as an aligned table of at most ``max_rows`` rows (0: all; the rest are
    counted). ``no changes`` for two tables that ship the same."""
    gate = gate or GateSettings()
    if result.empty and not result.regressions and not result.noise:
        verdict = gate_line(result, gate)
        return "no changes\n" + (verdict + "\n" if verdict else "")
    models = result.gpu_models
    with_gpu = len(models) > 1
    out = [counts_line(result)]
    if not with_gpu:
        out.append(f"GPU: {_plain(', '.join(models), False)}")
    if gate.armed:
        out.append(gate_line(result, gate))
    numeric = {i for i, h in enumerate(_header(with_gpu, "us")) if h in ("M", "N", "K")}
    for title, rows in sections(result):
        shown = rows if max_rows <= 0 else rows[:max_rows]
        lines = [_header(with_gpu, "us"), *(_cells(r, with_gpu) for r in shown)]
        widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
        out += ["", f"{title} ({len(rows)}):"]
        for line in lines:
            cells = [
                cell.rjust(w) if i in numeric else cell.ljust(w)
                for i, (cell, w) in enumerate(zip(line, widths, strict=True))
            ]
            out.append(("  " + "  ".join(cells)).rstrip())
        if len(shown) < len(rows):
            out.append(f"  ... and {len(rows) - len(shown)} more (--max-rows 0, or --json)")
    return "\n".join(out) + "\n"


# Sections longer than this are folded in <details> in markdown.
FOLD_ROWS = 10


def render_markdown(
    result: DiffResult, gate: GateSettings | None = None, old: str = "A", new: str = "B"
) -> str:
    """A pull-request-ready report: a title naming both tables, the gate's verdict, a
    table of counts, then one table per section (longer than ``FOLD_ROWS`` rows:
    folded in ``<details>``). ``old`` / ``new`` name the inputs."""
    gate = gate or GateSettings()
    out = [f"### cudal2-diff: A {_code(old)} → B {_code(new)}", ""]
    if gate.armed:
        verdict = gate_line(result, gate)
        mark = "❌" if result.gate_failures(gate.allow_removed) else "✅"
        out += [f"{mark} **{verdict}**", ""]
    regress = f"slower by more than {result.regression_pct:g}% (relative to the same-run baseline)"
    out += [
        "| | targets |",
        "|---|---:|",
        f"| in A → in B | {result.old_count} → {result.new_count} |",
        f"| removed | {len(result.removed)} |",
        f"| moved to the fallback | {len(result.to_fallback)} |",
        f"| {regress} | {len(result.regressions)} |",
        f"| changed (any reason) | {len(result.changed)} |",
        f"| added | {len(result.added)} |",
        f"| fallback → fallback, torch's time moved (noise) | {len(result.noise)} |",
        "",
    ]
    models = result.gpu_models
    with_gpu = len(models) > 1
    out.append(
        f"GPU: {_plain(', '.join(models), True) or '-'} · noise {result.noise_pct:g}% · "
        "what is compared: "
        "an entry's time relative to the torch baseline timed in the same run (a "
        "fallback's time is torch's own, never a regression) · M: the dispatched range"
    )
    header = _header(with_gpu, "µs")
    align = ["---" if h not in ("M", "N", "K") else "--:" for h in header]
    for title, rows in sections(result):
        table = [
            "| " + " | ".join(header) + " |",
            "|" + "|".join(align) + "|",
            *("| " + " | ".join(_cells(r, with_gpu, markdown=True)) + " |" for r in rows),
        ]
        out += ["", f"#### {title[0].upper()}{title[1:]} ({len(rows)})", ""]
        if len(rows) > FOLD_ROWS:
            fold = f"<details><summary>{len(rows)} targets</summary>"
            out += [fold, "", *table, "", "</details>"]
        else:
            out += table
    if result.empty and not result.regressions and not result.noise:
        out += ["", "No changes."]
    return "\n".join(out) + "\n"
