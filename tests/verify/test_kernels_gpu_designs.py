"""On the CPU: every parametrised GPU test of ``test_kernels_gpu.py`` and every design of
``test_epilogue_gpu.py`` builds a legal design, as the GPU run will build it, so a test
list that names a design its family refuses fails here and not in a GPU call's time; and
each group of sm90tma's trial designs (written, not yet measured) has a GPU test, so none
can move into the space without one.

Each GPU test is called with each of its parameter sets and the two functions that need
a GPU (``_check_design``, ``_strided_output``) replaced by a recorder, so the test's own
assertions (a design's membership, its recipe) run too."""

from __future__ import annotations

import importlib.util
import inspect
import itertools
from pathlib import Path
from types import ModuleType

import pytest

from cudal2.generator import design_name, legality
from cudal2.generator.families import sm90_tma
from cudal2.generator.families.base import with_epilogue
from cudal2.records import KernelDesign


def _module(stem: str) -> ModuleType:
    """A GPU test module of this folder, loaded under a name of its own (the tests are
    imported by path, ``--import-mode=importlib``)."""
    spec = importlib.util.spec_from_file_location(
        f"_cpu_{stem}", Path(__file__).with_name(f"{stem}.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


kernels_gpu = _module("test_kernels_gpu")
epilogue_gpu = _module("test_epilogue_gpu")

# The trial designs' groups (sm90_tma.trial_space's parts), each of which a GPU test
# must exercise.
TRIAL_GROUPS = {
    "uniform": sm90_tma.uniform_designs,
    "ping-pong pair": sm90_tma.pingpong_pair_designs,
    "tall": sm90_tma.tall_tma_store_designs,
    "tall pair": sm90_tma.tall_pair_designs,
    "stream-K": sm90_tma.streamk_designs,
}


def _cases(fn) -> list[dict]:
    """Every parameter set of ``fn``'s ``parametrize`` marks (their product)."""
    axes = []
    for mark in getattr(fn, "pytestmark", []):
        if mark.name != "parametrize":
            continue
        names, values = mark.args[0], mark.args[1]
        names = [n.strip() for n in names.split(",")] if isinstance(names, str) else list(names)
        rows = []
        for v in values:
            v = v.values if hasattr(v, "values") and not isinstance(v, dict) else v
            rows.append(dict(zip(names, v if len(names) > 1 else (v,), strict=True)))
        axes.append(rows)
    if not axes:  # a test of no parameters checks something else than a design list
        return []
    return [dict(kv for part in combo for kv in part.items()) for combo in itertools.product(*axes)]


@pytest.fixture(scope="module")
def recorded() -> list[tuple[str, KernelDesign]]:
    """(the case, its design) for every parameter set of every parametrised GPU test,
    recorded once for the module's tests."""
    seen: list[tuple[str, KernelDesign]] = []
    out = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(kernels_gpu, "_check_design", lambda _, d, *a, **k: seen.append(d))
        mp.setattr(kernels_gpu, "_strided_output", lambda _, d, *a, **k: seen.append(d))
        for name, fn in inspect.getmembers(kernels_gpu, inspect.isfunction):
            cases = _cases(fn) if name.startswith("test_") else []
            for params in cases:
                before = len(seen)
                fn(None, **params)
                assert len(seen) == before + 1, f"{name}{params}: no design reached the GPU check"
                out.append((f"{name}{params}", seen[-1]))
    return out


def test_every_gpu_test_builds_a_legal_design(recorded):
    designs = recorded
    assert len(designs) > 400  # every parametrised test, every parameter set
    for case, d in designs:
        assert legality(d) == [], f"{case}: {design_name(d)}: {legality(d)}"


def test_every_epilogue_gpu_design_is_legal():
    for shape, knobs in epilogue_gpu.DESIGNS.items():
        d = sm90_tma.design("fp16", **knobs)
        assert legality(d) == [], f"{shape}: {design_name(d)}: {legality(d)}"
    for shape in epilogue_gpu.GATED_TMA_DESIGNS:  # ... and gated, storing by TMA
        for act in ("silu", "gelu_tanh"):
            d = with_epilogue(sm90_tma.design("bf16", **epilogue_gpu.DESIGNS[shape]), act)
            assert legality(d) == [] and sm90_tma.gated_tma(d), (shape, legality(d))


@pytest.mark.parametrize("group", sorted(TRIAL_GROUPS))
def test_each_group_of_trial_designs_has_a_gpu_test(recorded, group):
    tested = {d.key for _, d in recorded}
    for dtype in ("fp16", "bf16"):
        assert tested & {d.key for d in TRIAL_GROUPS[group](dtype)}, (group, dtype)
    space = {d.key for dt in ("fp16", "bf16") for d in sm90_tma.trial_space("sm_90a", dt, "tn")}
    assert space == {d.key for dt in ("fp16", "bf16") for f in TRIAL_GROUPS.values() for d in f(dt)}
