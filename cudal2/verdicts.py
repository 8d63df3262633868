"""What the measurement database says about each kernel's compute-sanitizer checks, and
the rule that lets a kernel ship.

A kernel entry ships only if its artifact has a clean memcheck at its target, on its
GPU model, with its toolchain, recorded after every failure and every unfinished
check of that artifact. Per check key (``CheckKey``: GPU model, toolchain, artifact,
target), in file order:

- ``FAILED``: a failure of the key (a ``failed`` verdict, with or without its started
  line; or a legacy failure) after the key's latest ``started`` line, or later in time
  than it (a merged file from a host whose clock ran ahead); or failures and no start
  at all.
- ``CLEAN``: the key's latest ``started`` line has its ``clean`` verdict (same check
  id and key, after it), and no start of the key later in time lacks one.
- ``PENDING``: the latest start has no verdict: the check crashed, or its verdict line
  was torn or lost. It might have been a failure, so it is treated as one until a
  new check of the key finishes.
- ``UNCHECKED``: no line about the key.

An artifact is ``vetoed`` when any of its keys (any target, GPU model or toolchain)
is FAILED, and ``blocked`` when any is FAILED or PENDING; ``clear(key)`` is the ship
gate: the key CLEAN and the artifact not blocked. Why no torn or lost line lets a
rejected artifact ship is argued, case by case, in docs/measuring.md.
"""

from __future__ import annotations

import enum
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from cudal2.records import CheckEvent, CheckKey, SanitizerCheck


class Gate(enum.StrEnum):
    CLEAN = "clean"
    FAILED = "failed"
    PENDING = "pending"
    UNCHECKED = "unchecked"


@dataclass(frozen=True)
class _Line:
    pos: int
    check: SanitizerCheck


class SanitizerLedger:
    """The sanitizer checks of a database, in file order (``Contents.checks``); more
    lines may be ``add``ed as a build records them."""

    def __init__(self, checks: Iterable[SanitizerCheck] = ()):
        self._lines: dict[str, dict[CheckKey, list[_Line]]] = defaultdict(lambda: defaultdict(list))
        self._n = 0
        self._memo: dict[CheckKey, Gate] = {}
        for c in checks:
            self.add(c)

    def add(self, check: SanitizerCheck) -> None:
        self._lines[check.artifact_key][check.key].append(_Line(self._n, check))
        self._n += 1
        self._memo.clear()

    def state(self, key: CheckKey) -> Gate:
        """The key's own state (see the module's rule)."""
        if key not in self._memo:
            self._memo[key] = _state(self._lines.get(key.artifact, {}).get(key, []))
        return self._memo[key]

    def states(self, artifact: str) -> dict[CheckKey, Gate]:
        return {key: self.state(key) for key in self._lines.get(artifact, {})}

    def vetoed(self, artifact: str) -> bool:
        """A failure of the artifact stands, at some target, GPU model or toolchain."""
        return Gate.FAILED in self.states(artifact).values()

    def blocked(self, artifact: str) -> bool:
        """A failure or an unfinished check of the artifact stands somewhere."""
        return bool({Gate.FAILED, Gate.PENDING} & set(self.states(artifact).values()))

    def pending(self, artifact: str) -> list[SanitizerCheck]:
        """The latest started line of each PENDING key of the artifact."""
        out = []
        for key, lines in self._lines.get(artifact, {}).items():
            if self.state(key) == Gate.PENDING:
                out.append(_latest_start(lines).check)
        return out

    def clear(self, key: CheckKey) -> bool:
        """The ship gate: a clean check of this key stands, and no failure or unfinished
        check of its artifact anywhere."""
        return self.state(key) == Gate.CLEAN and not self.blocked(key.artifact)

    def failure(self, artifact: str) -> SanitizerCheck | None:
        """The artifact's latest recorded failure line, if any (for its report)."""
        fails = [
            ln
            for lines in self._lines.get(artifact, {}).values()
            for ln in lines
            if ln.check.event == CheckEvent.FAILED
        ]
        return max(fails, key=lambda ln: ln.pos).check if fails else None


def _latest_start(lines: list[_Line]) -> _Line:
    return max((ln for ln in lines if ln.check.event == CheckEvent.STARTED), key=lambda ln: ln.pos)


def _state(lines: list[_Line]) -> Gate:
    if not lines:
        return Gate.UNCHECKED
    starts = [ln for ln in lines if ln.check.event == CheckEvent.STARTED]
    failures = [ln for ln in lines if ln.check.event == CheckEvent.FAILED]
    if not starts:  # a verdict without its started line vouches for nothing
        return Gate.FAILED if failures else Gate.UNCHECKED
    last = _latest_start(starts)
    if any(f.pos > last.pos or f.check.at > last.check.at for f in failures):
        return Gate.FAILED
    if not _clean(lines, last):
        return Gate.PENDING
    # A start later in time (a merged file) whose check has no clean verdict.
    if any(s.check.at > last.check.at and not _clean(lines, s) for s in starts):
        return Gate.PENDING
    return Gate.CLEAN


def _clean(lines: list[_Line], start: _Line) -> bool:
    """The started line has its clean verdict after it (the same check id)."""
    return any(
        ln.pos > start.pos
        and ln.check.event == CheckEvent.CLEAN
        and ln.check.check == start.check.check
        for ln in lines
    )
