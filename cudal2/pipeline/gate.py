"""The sanitizer gate of a build: no kernel is selected without a clean
compute-sanitizer memcheck on record for its artifact at its target, on its GPU model,
with its toolchain, after every failure and unfinished check of that artifact
(``cudal2.verdicts``).

The selection is first made as if every kernel without a failure were clean. The
winners without a clean check are then checked where the runner can (a GPU): each
check is announced in the database (a ``started`` line, fsynced) before memcheck
runs, and its verdict appended when it returns, all under the database's check lock;
the selection is repeated until every selected kernel is clean. Where nothing can be
checked (a build replaying its own database: no GPU), such kernels wait: they are not
selected, their targets take the next checked candidate, cuBLASLt or the fallback,
and the log says how many wait for a sanitizer run on a GPU.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

from cudal2 import __version__
from cudal2.database import MeasurementDB
from cudal2.pipeline.results import job_for, now
from cudal2.pipeline.select import Selection, select
from cudal2.records import (
    CheckEvent,
    CheckKey,
    GpuInfo,
    JobKind,
    Measurement,
    SanitizerCheck,
    Status,
    Target,
)
from cudal2.verdicts import Gate, SanitizerLedger

if TYPE_CHECKING:
    from cudal2.verify.runner import Runner


def shipped_kernels(selections: Iterable[Selection]) -> list[Measurement]:
    """The kernel measurements whose cubins ``selections`` ship: each kernel winner
    and each eager alternative."""
    out = []
    for s in selections:
        if s.kind == "kernel" and s.winner is not None:
            out.append(s.winner)
        if s.eager is not None:
            out.append(s.eager)
    return out


def _twins_kept(gated: Sequence[Selection], ungated: Sequence[Selection]) -> list[Selection]:
    """``gated`` with what the unchecked selection says of a row-scaled target its twins
    serve (``twin_us``, ``displaced``; ``select.prefer_twins``) where the gated one falls
    back too: a displaced kernel is never checked (it does not ship), so the gated
    selection alone would not know why its target falls back (the build's summary says)."""
    twins = {(s.gpu, s.target): s for s in ungated if s.displaced is not None}
    out = []
    for s in gated:
        o = twins.get((s.gpu, s.target))
        if o is not None and s.kind == "fallback" and s.displaced is None:
            s = dataclasses.replace(s, twin_us=o.twin_us, displaced=o.displaced)
        out.append(s)
    return out


def check_key(m: Measurement) -> CheckKey:
    """The key of the check a kernel measurement needs to ship."""
    return CheckKey(m.gpu.name, m.toolchain, m.artifact_key, m.target.key)


class SanitizerGate:
    """The gate of one build over one database: what it checked, what failed, and what
    waits for a GPU (kept across ``select`` calls: a key is checked once per build)."""

    def __init__(
        self,
        db: MeasurementDB | None,
        ledger: SanitizerLedger,
        say: Callable[[str], None] = lambda msg: None,
    ):
        self.db = db
        self.ledger = ledger
        self.say = say
        self.checked: set[CheckKey] = set()
        self.failed: set[CheckKey] = set()
        self.waiting: set[tuple[str, Target]] = set()  # (GPU model, target) whose kernel waits
        # (GPU model, target) whose eager alternative waits for a check
        self.eager_waiting: set[tuple[str, Target]] = set()

    def select(
        self,
        targets: Iterable[Target],
        history: Sequence[Measurement],
        mode: str,
        shippable: Callable[[Measurement], bool],
        runner: Runner | None = None,
        gpu: GpuInfo | None = None,
        cubins: Callable[[Sequence[Measurement]], dict[str, str]] | None = None,
        recheck: bool = False,
        host_saving_us: float = 0.0,
    ) -> tuple[list[Selection], list[Target]]:
        """The selection with the gate. ``runner``: where would-be winners are checked
        (None: nowhere; they wait), on ``gpu``, with ``cubins(measurements)`` giving
        each artifact's cubin path on the runner's host. ``recheck``: check every
        would-be winner once in this build, whatever its record says (a failure too:
        a clean check recorded after it lifts its veto). ``host_saving_us``: eager
        alternatives (``select``), gated as winners are: they ship kernels too."""
        targets = list(targets)
        here = gpu.name if runner is not None and gpu is not None else None
        waiting: dict[CheckKey, Measurement] = {}  # would-be winners that cannot ship yet

        def contender(x: Measurement) -> bool:
            key = check_key(x)
            if key in waiting or not shippable(x):
                return False
            if x.gpu.name != here:  # nothing of another GPU model is checked here
                return self.ledger.clear(key)
            return not self.ledger.vetoed(x.artifact_key) or (recheck and key not in self.checked)

        # The kernels other GPU models would ship once checked: they wait.
        unchecked = self._unchecked(targets, history, mode, shippable)
        for s in (s for s in unchecked if s.kind == "kernel"):
            if (
                s.gpu != here
                and s.winner is not None
                and not self.ledger.clear(check_key(s.winner))
            ):
                waiting[check_key(s.winner)] = s.winner
        while here is not None:
            selections, _ = select(targets, history, mode, contender, host_saving_us)
            todo = {check_key(w): w for w in shipped_kernels(selections) if self._needs(w, recheck)}
            if not todo:
                break
            fresh = {k: w for k, w in todo.items() if k not in self.checked}
            # checked in this build and still not clear (an unfinished check elsewhere)
            waiting.update((k, w) for k, w in todo.items() if k not in fresh)
            if fresh:
                assert runner is not None and gpu is not None and cubins is not None
                failed = self._check(runner, gpu, list(fresh.values()), cubins, waiting, recheck)
                if failed:
                    self.say(
                        f"{len(failed)} selected kernels failed compute-sanitizer: reselecting"
                    )
        entries = {(w.gpu.name, w.target) for w in waiting.values()}
        self.waiting |= entries
        if entries:
            gpus = ", ".join(sorted({g for g, _ in entries}))
            self.say(
                f"{len(entries)} selected kernels wait for a sanitizer run on a GPU ({gpus}): "
                "no clean compute-sanitizer memcheck of their artifact at their target is "
                "recorded for that GPU model and toolchain, so they are not shipped and their "
                "targets take the next checked candidate or the fallback (on the GPU: "
                "cudal2-build, or bash ci/gpu_memcheck.sh for the committed databases)"
            )

        def gated(x: Measurement) -> bool:
            return shippable(x) and self.ledger.clear(check_key(x))

        got = select(targets, history, mode, gated, host_saving_us)
        if host_saving_us > 0:
            self._eager_waiting(targets, history, mode, shippable, host_saving_us, got[0])
        return _twins_kept(got[0], unchecked), got[1]

    def _eager_waiting(
        self,
        targets: Sequence[Target],
        history: Sequence[Measurement],
        mode: str,
        shippable: Callable[[Measurement], bool],
        host_saving_us: float,
        selections: Sequence[Selection],
    ) -> None:
        """Say how many eager alternatives a clean check would ship (kept apart from
        the winners that wait: an alternative only saves host time)."""

        def contender(x: Measurement) -> bool:
            return shippable(x) and not self.ledger.vetoed(x.artifact_key)

        shipped = {(s.gpu, s.target) for s in selections if s.eager is not None}
        unchecked = {
            (s.gpu, s.target)
            for s in select(targets, history, mode, contender, host_saving_us)[0]
            if s.eager is not None and not self.ledger.clear(check_key(s.eager))
        } - shipped
        self.eager_waiting |= unchecked
        if unchecked:
            self.say(
                f"{len(unchecked)} eager alternatives are not shipped until compute-sanitizer "
                "has checked them on a GPU (bash ci/gpu_memcheck.sh): no clean memcheck of "
                "their artifact at their target is recorded"
            )

    def _unchecked(
        self,
        targets: Sequence[Target],
        history: Sequence[Measurement],
        mode: str,
        shippable: Callable[[Measurement], bool],
    ) -> list[Selection]:
        """The selections if every kernel without a failure were clean."""

        def contender(x: Measurement) -> bool:
            return shippable(x) and not self.ledger.vetoed(x.artifact_key)

        return select(targets, history, mode, contender)[0]

    def _needs(self, w: Measurement, recheck: bool) -> bool:
        key = check_key(w)
        return not self.ledger.clear(key) or (recheck and key not in self.checked)

    def _check(
        self,
        runner: Runner,
        gpu: GpuInfo,
        winners: Sequence[Measurement],
        cubins: Callable[[Sequence[Measurement]], dict[str, str]],
        waiting: dict[CheckKey, Measurement],
        recheck: bool = False,
    ) -> set[CheckKey]:
        """memcheck ``winners`` (those without a clean check, or all where
        ``recheck``) and any unfinished check of their artifacts on this GPU model, each
        announced before it runs and its verdict recorded after it; returns the keys
        that failed. Unanswered keys go to ``waiting``."""
        assert self.db is not None, "a gate that checks kernels records the verdicts"
        with self.db.locked():
            # Another build may have checked since this one read the database.
            self.ledger = SanitizerLedger(self.db.load(warn=False).checks)
            items: dict[CheckKey, Measurement] = {}
            for w in winners:
                if recheck or self.ledger.state(check_key(w)) != Gate.CLEAN:
                    items[check_key(w)] = w
                for start in self.ledger.pending(w.artifact_key):  # a lost or crashed verdict
                    if start.gpu == gpu.name:
                        again = dataclasses.replace(
                            w, target=start.target, toolchain=start.toolchain
                        )
                        items.setdefault(check_key(again), again)
            mine = {check_key(w) for w in winners}
            self.checked |= mine
            if not items:  # another build checked them meanwhile
                return set()
            paths = cubins(list(items.values()))
            jobs = [job_for(JobKind.SANITIZE, w, paths[w.artifact_key]) for w in items.values()]
            at = now()
            starts = {
                key: SanitizerCheck(
                    uuid.uuid4().hex,
                    CheckEvent.STARTED,
                    gpu.name,
                    w.toolchain,
                    w.artifact_key,
                    w.target,
                    at,
                    __version__,
                )
                for key, w in items.items()
            }
            # Announced (fsynced) before memcheck runs: a crash leaves them pending.
            self.db.append_checks(starts.values())
            for start in starts.values():
                self.ledger.add(start)
            self.checked |= items.keys()
            failed: set[CheckKey] = set()
            for res in runner.run(jobs):
                job = res.job
                key = CheckKey(gpu.name, job.toolchain, job.artifact_key, job.target.key)
                if not res.recorded:  # no verdict: the check stays pending
                    if key in mine:
                        waiting.setdefault(key, items[key])
                    continue
                verdict = starts[key].verdict(res.status == Status.OK, now(), res.error)
                self.db.append_checks([verdict])
                self.ledger.add(verdict)
                if verdict.event == CheckEvent.FAILED:
                    failed.add(key)
        self.failed |= failed
        return failed


def ledger_of(checks: Iterable[SanitizerCheck], history: Iterable[Measurement]) -> SanitizerLedger:
    """The ledger of a database's checks (``Contents.checks``), or, for measurements
    handed over without them, of the failures recorded among the measurements."""
    checks = list(checks)
    if not checks:
        checks = [SanitizerCheck.of_failure(m) for m in history if m.status == Status.SANITIZER]
    return SanitizerLedger(checks)
