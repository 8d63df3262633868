"""The one interface every search strategy implements: ``propose`` and ``observe``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from cudal2.records import KernelDesign, Measurement, Target


class Proposer(Protocol):
    """A search strategy. ``name`` is recorded in every Measurement it caused."""

    name: str

    def propose(self, target: Target, history: Sequence[Measurement], n: int) -> list[KernelDesign]:
        """Up to ``n`` legal designs for ``target`` not yet in ``history`` for it."""
        ...

    def observe(self, measurements: Sequence[Measurement]) -> str | None:
        """Learn from a round's results (plain strategies ignore them); returns a line
        for the build's log when something was learned."""
        ...


def measured_designs(target: Target, history: Sequence[Measurement]) -> set[str]:
    """Design keys already measured on this target (any status: failures count too)."""
    return {m.design_key for m in history if m.target == target}
