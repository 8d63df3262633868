"""What a measuring worker keeps per target (``cudal2.verify.inputs``), its logic run
on the CPU (operands made on the CPU, the same code otherwise): a candidate checked
with kept trials gets the same ``CheckResult`` as with trials drawn afresh, for honest
kernels and for kernels wrong in each way the checks catch, in any order; a kernel
that writes its residual (in place) or its read-only inputs leaves nothing behind for
the next; the kept bytes stay bounded."""

from __future__ import annotations

import dataclasses

import pytest

from cudal2.records import Target
from cudal2.verify import correctness, inputs
from cudal2.verify.inputs import Fresh, InputCache
from cudal2.verify.timing import Captured

torch = pytest.importorskip("torch")

SEED = 7


@pytest.fixture(autouse=True)
def on_cpu(monkeypatch):
    monkeypatch.setattr(correctness, "DEVICE", "cpu")


def _target(epilogue: str = "none", dtype: str = "fp16", m=24, n=40, k=96) -> Target:
    return Target("sm_90a", dtype, "tn", m, n, k, epilogue=epilogue)


def _acc(t: Target, a, b, epi):
    """The fused op from its definition (not the suite's code), in fp32."""
    acc = a.float() @ b.float().t()
    if t.epilogue.startswith("rmsnorm"):
        acc = acc / torch.sqrt((a.float() ** 2).sum(1, keepdim=True) / t.k + 1e-5)
    for name in ("bias", "residual"):
        if name in epi:
            acc = acc + epi[name].float()
    if t.epilogue in ("silu", "rmsnorm_silu"):
        g, u = acc[:, 0::2], acc[:, 1::2]
        acc = g / (1 + torch.exp(-g)) * u
    return acc


class Kernel:
    """A CPU stand-in for a candidate: ``run(a, b, c[, epi])`` writes C; ``flaw`` breaks
    one thing. Calls are counted per candidate, so a flaw that depends on the call
    (a race) behaves alike whichever inputs it gets."""

    def __init__(self, t: Target, flaw: str = ""):
        self.t, self.flaw, self.calls = t, flaw, 0

    def __call__(self, a, b, c, epi=None):
        self.calls += 1
        epi = epi or {}
        acc = _acc(self.t, a, b, epi)
        exact = bool(((a == 0) | (a == 1)).all())
        if self.flaw == "off" or (self.flaw == "off_on_exact" and exact):
            acc[3, 5] += 1.0
        if self.flaw == "race" and self.calls == 3:  # the second repeat differs a little
            acc[0, 0] += 2 * abs(float(acc[0, 0])) * correctness.OUT_EPS[self.t.dtype] + 1e-3
        c.copy_(acc.to(c.dtype))
        if self.flaw == "unwritten":
            c[-1] = float("nan")
        if self.flaw == "writes_a":
            a.view(-1)[0] += 1
        if self.flaw == "writes_b_on_repeat" and self.calls == 2:
            b.view(-1)[-1] = 0.0
        if self.flaw == "writes_bias" and "bias" in epi:
            epi["bias"].zero_()
        if self.flaw == "in_place" and "residual" in epi:
            epi["residual"].copy_(c)  # R = C: an in-place epilogue's write


def _check(t: Target, flaw: str, source) -> correctness.CheckResult:
    return correctness.check(t, Kernel(t, flaw), SEED, inputs=source)


FLAWS = {
    "": "",
    "off": "random trial 0: max |error|",
    "off_on_exact": "exact {0,1} trial",
    "unwritten": "not written",
    "race": "repeat 2:",
    "writes_a": "random trial 0: the kernel wrote into its input(s) a",
    "in_place": "random trial 0: the kernel wrote into its input(s) residual",
    "writes_b_on_repeat": "repeat 1: the kernel wrote into its input(s) b",
}
TARGETS = [
    _target(),
    _target(dtype="bf16", m=17, n=33, k=200),
    _target("bias"),
    _target("residual"),
    _target("bias_residual", "bf16"),
    _target("rmsnorm"),
    _target("silu"),
]


@pytest.mark.parametrize("t", TARGETS, ids=lambda t: t.label)
def test_kept_trials_give_every_candidate_the_verdict_of_fresh_ones(t):
    """One cache through a sequence of candidates (each flaw, then honest again), each
    result equal to the result with trials drawn afresh, field for field."""
    if t.epilogue in ("rmsnorm", "silu"):
        flaws = ["", "off", "unwritten", "race", "writes_a", ""]  # {0,1} trial bounded there
    else:
        flaws = [*(f for f in FLAWS if f != "in_place"), ""]
    if "bias" in t.epilogue:
        flaws.insert(1, "writes_bias")
    if "residual" in t.epilogue:
        flaws.insert(1, "in_place")
    cache = InputCache()
    for flaw in flaws:
        fresh = _check(t, flaw, correctness.FRESH)
        kept = _check(t, flaw, cache)
        assert kept == fresh, flaw
        if flaw:
            want = FLAWS.get(flaw, "wrote into its input(s) bias")
            assert not kept.ok and want in kept.error, (flaw, kept.error)
        else:
            assert kept.ok, kept.error


@pytest.mark.parametrize("t", [_target("residual"), _target("bias_residual")], ids=str)
def test_a_kernel_that_writes_its_residual_fails_and_poisons_nothing(t, monkeypatch):
    """An epilogue that writes R (as if launched in place, R = C, though here R is not
    C) fails, as its repeats did before trials were kept; it wrote a copy, so the kept
    trial is still as drawn and the next candidate reuses it."""
    cache = InputCache()
    assert _check(t, "", cache).ok
    kept = {i: cache.trial(t, SEED, i, k).epi["residual"].clone() for i, k in _trials()}
    res = _check(t, "in_place", cache)
    assert res == _check(t, "in_place", correctness.FRESH)
    assert not res.ok and "random trial 0: the kernel wrote into its input(s) residual" in res.error
    drawn = []
    monkeypatch.setattr(correctness, "draw", lambda *a: drawn.append(a) or None)
    assert _check(t, "", cache).ok
    assert drawn == [] and cache.redrawn == 0  # nothing written: nothing drawn again
    for i, k in _trials():
        assert torch.equal(cache.trial(t, SEED, i, k).epi["residual"], kept[i])


def _trials():
    return [(0, "random"), (1, "random"), (2, "exact")]


def test_a_kernel_that_writes_its_inputs_fails_and_its_trial_is_not_kept():
    t = _target()
    cache = InputCache()
    assert _check(t, "", cache).ok
    drawn = []
    real = correctness.draw

    def counted(*a):
        drawn.append(a[2])
        return real(*a)

    correctness.draw = counted
    try:
        res = _check(t, "writes_a", cache)
        assert not res.ok and "wrote into its input(s) a" in res.error
        assert drawn == []  # it ran on the kept trial 0...
        assert _check(t, "", cache).ok
        assert drawn == [0]  # ...which was dropped: the next candidate draws it afresh
        assert cache.redrawn == 0  # (by the check that saw the write, not found later)
    finally:
        correctness.draw = real


def test_the_second_candidate_draws_nothing_and_asks_the_vendors_once_per_trial():
    t = _target()
    asked = []

    def vendor_errors(t, a, b, ref):
        asked.append(1)
        return correctness.torch_error(t, a, b, ref)

    cache = InputCache()
    for _ in range(3):
        assert correctness.check(t, Kernel(t), SEED, vendor_errors=vendor_errors, inputs=cache).ok
    assert len(asked) == 2  # the two random trials, once
    assert cache.stats()["misses"] == 3 and cache.stats()["hits"] == 6
    asked.clear()
    for _ in range(3):
        correctness.check(t, Kernel(t), SEED, vendor_errors=vendor_errors)
    assert len(asked) == 6  # drawn afresh: every candidate asks again


def test_vendor_errors_are_kept_per_yardstick():
    t = _target()
    cache = InputCache()
    torch_only = correctness.check(t, Kernel(t), SEED, inputs=cache)

    def two(t, a, b, ref):
        return {**correctness.torch_error(t, a, b, ref), "other": 0.0}

    both = correctness.check(t, Kernel(t), SEED, vendor_errors=two, inputs=cache)
    assert torch_only.vendors == ("torch",) and both.vendors == ("other", "torch")


def test_a_stray_write_into_a_kept_trial_is_seen_and_the_trial_drawn_again():
    t = _target("bias")
    cache = InputCache()
    first = _check(t, "", cache)
    cache.trial(t, SEED, 0, "random").ref[1, 1] += 3.0  # e.g. another kernel's stray write
    assert _check(t, "", cache) == first
    assert cache.redrawn == 1


def test_each_trial_draws_from_its_own_generator():
    """Trial i's inputs depend on (seed, target, i) only: not on what was drawn before,
    nor on which other trials exist; another seed or target draws others."""
    t = _target("bias")
    one = correctness.draw(t, SEED, 1, "random")
    again = correctness.draw(t, SEED, 1, "random")
    pairs = zip(one.tensors().values(), again.tensors().values(), strict=True)
    assert all(torch.equal(x, y) for x, y in pairs)
    assert not torch.equal(one.a, correctness.draw(t, SEED, 0, "random").a)
    assert not torch.equal(one.a, correctness.draw(t, SEED + 1, 1, "random").a)
    other = dataclasses.replace(t, n=48)
    assert not torch.equal(one.a, correctness.draw(other, SEED, 1, "random").a)
    assert correctness.derived_seed(SEED, t, "trial1") < 2**63


def test_a_generator_is_refused_as_the_seed():
    g = torch.Generator()
    with pytest.raises(TypeError, match="seed must be an int"):
        correctness.check(_target(), Kernel(_target()), g)


def test_the_kept_bytes_stay_within_the_bound_least_recently_used_out_first():
    small, other = _target(), _target(m=32)
    one = correctness.draw(small, SEED, 0, "random").nbytes
    cache = InputCache(max_bytes=2 * one + one // 2)  # two trials of these sizes fit
    cache.trial(small, SEED, 0, "random")
    cache.trial(small, SEED, 1, "random")
    assert cache.stats()["entries"] == 2 and cache.bytes == 2 * one
    cache.trial(small, SEED, 0, "random")  # used: trial 1 is now the oldest
    cache.trial(other, SEED, 0, "random")
    assert cache.bytes <= cache.max_bytes
    assert ("trial", small.key, SEED, 1, "random") not in cache._kept
    assert ("trial", small.key, SEED, 0, "random") in cache._kept
    huge = _target(m=400, n=400, k=400)
    got = cache.trial(huge, SEED, 0, "random")  # larger than the bound: used, not kept
    assert got.nbytes > cache.max_bytes and cache.bytes <= cache.max_bytes
    assert ("trial", huge.key, SEED, 0, "random") not in cache._kept


def test_a_timing_pool_is_kept_and_each_job_gets_its_own_residuals():
    t = _target("bias_residual")
    cache = InputCache()
    pool = cache.timing(t, SEED, 3)
    assert cache.timing(t, SEED, 3) is pool
    fresh = inputs.draw_timing(t, SEED, 3)
    for (a, b), (fa, fb) in zip(pool.sets, fresh.sets, strict=True):
        assert torch.equal(a, fa) and torch.equal(b, fb)
    job = pool.for_job()
    for e, mine in zip(pool.epis, job, strict=True):
        assert mine["bias"] is e["bias"]  # read-only: shared
        assert mine["residual"] is not e["residual"]
        assert torch.equal(mine["residual"], e["residual"])
        mine["residual"].fill_(9.0)  # an in-place epilogue writes its copy...
        assert not torch.equal(mine["residual"], e["residual"])  # ...not the pool's
    # the timing pool is not a trial's inputs
    assert not torch.equal(pool.sets[0][0], correctness.draw(t, SEED, 0, "random").a)
    assert isinstance(Fresh().timing(t, SEED, 2), inputs.TimingSets)


def cpu_capture(fn, nsets, calls, keep=(), own_bytes=0, stream=None):
    """``timing.capture`` on the CPU: the callable itself stands for its graph."""
    return Captured(fn, nsets, calls, keep, own_bytes)


def one_call_each(fns, nsets, cfg, est_us=10.0, phases=None, stop=None, stop_after=5):
    """``time_interleaved`` on the CPU: one call per operand set of each callable (a
    kept graph's callable too); every sample 1 µs, ``stop`` asked as the real one asks
    it."""
    from cudal2.verify.timing import Timing

    for fn in fns.values():
        for j in range(nsets):
            (fn.graph if isinstance(fn, Captured) else fn)(j)
    reps = cfg.reps
    if stop is not None and stop({name: (1.0,) * stop_after for name in fns}):
        reps = stop_after
    return {name: Timing((1.0,) * reps) for name in fns}


def _job(t: Target):
    from cudal2.records import Job, JobKind, TimingConfig

    return Job(
        JobKind.MEASURE,
        t,
        TimingConfig(reps=5),
        toolchain="cpu",
        artifact_key="cpu:kernel",
        symbol="cpu_kernel",
        recipe={},
        cubin="",
    )


@pytest.mark.parametrize("t", [_target(), _target("bias_residual")], ids=lambda t: t.label)
def test_the_worker_answers_a_batch_alike_with_and_without_its_cache(t, monkeypatch):
    """``_check_and_time`` on the CPU (timing replaced by one call per operand set):
    the same statuses, errors and metrics for a batch of good and wrong candidates,
    and a candidate that writes its residual while timed leaves the pool as drawn."""
    from cudal2.verify import worker

    monkeypatch.setattr(worker, "time_interleaved", one_call_each)
    monkeypatch.setattr(worker, "capture", cpu_capture)
    monkeypatch.setattr(worker, "operand_sets", lambda nbytes: 3)  # not 4,096 tiny sets
    gpu = "NVIDIA H100 80GB HBM3"
    batch = ["", "off", "writes_a", "", "unwritten", "race", "off_on_exact", "timed_writes_r", ""]

    class TimedWritesR(Kernel):
        def __call__(self, a, b, c, epi=None):
            super().__call__(a, b, c, epi)
            if self.calls > 5 and epi and "residual" in epi:  # after the checks' 5 runs
                epi["residual"].fill_(9.0)

    def answer(flaw, source):
        k = TimedWritesR(t) if flaw == "timed_writes_r" else Kernel(t, flaw)
        return worker._check_and_time(_job(t), k, gpu, correctness.torch_error, inputs=source)

    cache = InputCache()
    for flaw in batch:
        fresh, kept = answer(flaw, None), answer(flaw, cache)
        assert (kept.status, kept.error, kept.metrics) == (fresh.status, fresh.error, fresh.metrics)
        assert (kept.max_abs_err, kept.samples_us) == (fresh.max_abs_err, fresh.samples_us)
        assert (kept.status == "ok") == (flaw in ("", "timed_writes_r")), (flaw, kept.error)
    seed = _job(t).timing.seed
    assert cache.stats()["hits"] > 0
    pool, drawn = cache.timing(t, seed, 3), inputs.draw_timing(t, seed, 3)
    assert bool(pool.epis[0]) == (t.epilogue != "none")  # (compared below)
    for e, d in zip(pool.epis, drawn.epis, strict=True):
        assert all(torch.equal(e[n], d[n]) for n in e)


# -- torch's graph, kept per target ---------------------------------------------------
class _Graph:
    """Stands in for a CUDA graph (weakly referenceable: freed is checked)."""


def _capturing(made: list, own_bytes: int = 1000):
    """A ``capture(sets)`` for ``InputCache.baseline``: a stand-in graph with outputs
    of its own, reading ``sets``."""

    def capture(sets):
        made.append(sets)
        outs = [torch.empty(4, 4) for _ in sets.sets]
        return Captured(_Graph(), len(sets.sets), 10, keep=(sets, outs), nbytes=own_bytes)

    return capture


def test_torch_s_graph_is_kept_per_target_and_timing_config_and_counted():
    from cudal2.records import TimingConfig

    t, cfg = _target("bias_residual"), TimingConfig()
    cache, made = InputCache(), []
    g = cache.baseline(t, cfg, 3, 10, _capturing(made))
    assert cache.baseline(t, cfg, 3, 10, _capturing(made)) is g and len(made) == 1
    sets = cache.timing(t, cfg.seed, 3)
    assert made[0] is sets and g.keep[0] is sets  # it reads the kept sets themselves
    assert cache.bytes == sets.nbytes + 1000
    # another mode, seed or launch count: another graph (another seed: other sets)
    cache.baseline(t, dataclasses.replace(cfg, mode="server"), 3, 10, _capturing(made))
    cache.baseline(t, dataclasses.replace(cfg, seed=1), 3, 10, _capturing(made))
    cache.baseline(t, cfg, 3, 20, _capturing(made))
    assert len(made) == 4 and made[2] is not sets
    # drawn afresh: captured every time
    fresh = Fresh()
    fresh.baseline(t, cfg, 3, 10, _capturing(made))
    fresh.baseline(t, cfg, 3, 10, _capturing(made))
    assert len(made) == 6


def test_an_evicted_graph_is_freed_with_what_it_reads_and_writes():
    """A graph goes with the timing sets it reads (whichever way they go), and what it
    touched is then freed: nothing a later job frees is left under a kept graph."""
    import gc
    import weakref

    from cudal2.records import TimingConfig

    t, other, cfg = _target(), _target(m=32), TimingConfig()
    one = inputs.draw_timing(t, SEED, 3).nbytes
    cache = InputCache(max_bytes=one + 1000 + one // 2)  # t's sets and graph, not more
    g = cache.baseline(t, cfg, 3, 10, _capturing([]))
    refs = [weakref.ref(x) for x in (g.graph, g.keep[1][0], g.keep[0].sets[0][0])]
    del g
    cache.timing(other, cfg.seed, 3)  # pushes out t's sets, oldest: the graph goes too
    gc.collect()
    assert [r() for r in refs] == [None, None, None]
    assert [k[0] for k in cache._kept] == ["timing"] and cache.bytes == cache._kept_bytes()
    # dropped with its sets, or with its target
    cache.baseline(t, cfg, 3, 10, _capturing([]))
    cache._drop(("timing", t.key, cfg.seed, 3))
    assert not any(k[0] == "graph" for k in cache._kept)
    cache.baseline(t, cfg, 3, 10, _capturing([]))
    cache.drop_target(t)
    assert not any(k[1] == t.key for k in cache._kept) and cache.bytes == cache._kept_bytes()


def test_a_graph_is_not_kept_once_its_sets_were_pushed_out_to_make_room_for_it():
    from cudal2.records import TimingConfig

    t, cfg = _target(), TimingConfig()
    one = inputs.draw_timing(t, SEED, 3).nbytes
    cache = InputCache(max_bytes=one + 500)  # the sets alone fit, the graph (1000) does not
    g = cache.baseline(t, cfg, 3, 10, _capturing([]))
    assert g.graph is not None  # used once
    assert cache._kept == {} and cache.bytes == 0  # its sets went to make room: nor it


def test_what_is_prepared_goes_only_into_free_room():
    small, other = _target(), _target(m=32)
    one = correctness.draw(small, SEED, 0, "random").nbytes
    cache = InputCache(max_bytes=one + one // 2)
    cache.trial(small, SEED, 0, "random")
    with cache.without_eviction():
        cache.trial(other, SEED, 0, "random")  # would push the kept trial out: not kept
    assert cache.full and list(cache._kept) == [("trial", small.key, SEED, 0, "random")]
    cache.trial(other, SEED, 0, "random")  # a job's: evicts as before
    assert list(cache._kept) == [("trial", other.key, SEED, 0, "random")]


# -- the worker: torch captured once per target; targets prepared ahead ---------------
GPU_NAME = "NVIDIA H100 80GB HBM3"


@pytest.fixture
def worker_on_cpu(monkeypatch):
    """``_check_and_time`` on the CPU (as the batch test above), counting captures."""
    from cudal2.verify import worker

    captured = []

    def counted(fn, nsets, calls, keep=(), own_bytes=0, stream=None):
        captured.append(keep)
        return cpu_capture(fn, nsets, calls, keep, own_bytes)

    monkeypatch.setattr(worker, "time_interleaved", one_call_each)
    monkeypatch.setattr(worker, "capture", counted)
    monkeypatch.setattr(worker, "operand_sets", lambda nbytes: 3)
    return worker, captured


@pytest.mark.parametrize("t", [_target(), _target("bias_residual")], ids=lambda t: t.label)
def test_torch_is_captured_once_per_target_and_writes_outputs_of_its_own(t, worker_on_cpu):
    worker, captured = worker_on_cpu
    cache = InputCache()
    for _ in range(3):
        res = worker._check_and_time(
            _job(t), Kernel(t), GPU_NAME, correctness.torch_error, inputs=cache
        )
        assert res.status == "ok", res.error
    assert len(captured) == 1  # three jobs, one capture of torch's graph
    sets, torch_outs = captured[0]
    assert sets is cache.timing(t, _job(t).timing.seed, 3) and len(torch_outs) == 3
    for _ in range(2):
        worker._check_and_time(_job(t), Kernel(t), GPU_NAME, correctness.torch_error, inputs=None)
    assert len(captured) == 3  # drawn afresh: captured each job
    # torch's outputs hold its product: written by its graph, read by no candidate
    a, b = sets.sets[0]
    want = correctness.vendor(t, a, b, epi=sets.epis[0])
    assert torch.equal(torch_outs[0], want)


@pytest.mark.parametrize(
    "t", [_target(), _target("bias_residual"), _target("silu")], ids=lambda t: t.label
)
def test_a_prepared_target_s_first_job_draws_asks_and_captures_nothing(
    t, worker_on_cpu, monkeypatch
):
    """``worker.prepare`` makes what the target's first job would: that job then draws
    no trial or timing set, asks no vendor and captures nothing, and answers as a job
    with nothing kept does."""
    worker, captured = worker_on_cpu
    asked = []

    def vendor_errors(t, a, b, ref):
        asked.append(1)
        return correctness.torch_error(t, a, b, ref)

    cfg = _job(t).timing
    fresh = worker._check_and_time(_job(t), Kernel(t), GPU_NAME, vendor_errors, inputs=None)
    cache = InputCache()
    worker.prepare(t, cfg, GPU_NAME, vendor_errors, cache)
    assert len(captured) == 2 and cache.stats()["entries"] == 5  # 3 trials, sets, graph
    asked.clear()

    def refused(*a, **k):
        raise AssertionError("made again")

    monkeypatch.setattr(correctness, "draw", refused)
    monkeypatch.setattr(inputs, "draw_timing", refused)
    monkeypatch.setattr(worker, "capture", refused)
    monkeypatch.setattr(correctness, "unfused_error", refused)  # an epilogue's yardstick
    kept = worker._check_and_time(_job(t), Kernel(t), GPU_NAME, vendor_errors, inputs=cache)
    assert asked == []
    assert (kept.status, kept.error, kept.metrics, kept.max_abs_err) == (
        fresh.status,
        fresh.error,
        fresh.metrics,
        fresh.max_abs_err,
    )


def test_the_worker_answers_with_its_job_seconds_by_phase(worker_on_cpu, tmp_path, monkeypatch):
    """``run_job``'s answer carries the job's wall seconds and their phases (never a
    record's metrics: tests/cudal2/test_records.py)."""
    worker, _ = worker_on_cpu
    t = _target("bias")
    monkeypatch.setattr(worker.driver, "Kernel", lambda *a: None)
    monkeypatch.setattr(worker, "launch_dense", lambda *a: None)
    job = dataclasses.replace(_job(t), cubin=str(tmp_path / "k.cubin"), recipe={"smem_bytes": 0})
    (tmp_path / "k.cubin").write_bytes(b"")
    phases_seen = {}

    def checked(job, run, gpu, errs, **kw):
        phases_seen.update(kw["phases"])
        kw["phases"]["correctness"] = 0.25
        return worker.JobResult(job, "ok", samples_us=(1.0,))

    monkeypatch.setattr(worker, "_check_and_time", checked)
    res = worker.run_job(job, 0, GPU_NAME, correctness.torch_error)
    assert set(phases_seen) == {"module_load"}
    assert res.phases_s["correctness"] == 0.25 and res.phases_s["module_load"] >= 0
    assert res.job_s is not None and res.job_s >= res.phases_s["module_load"]
    assert res.metrics == {}


@pytest.mark.parametrize("t", [_target(), _target("bias_residual")], ids=lambda t: t.label)
def test_check_and_time_fills_each_phase(t, worker_on_cpu):
    worker, _ = worker_on_cpu
    phases: dict[str, float] = {}
    res = worker._check_and_time(
        _job(t), Kernel(t), GPU_NAME, correctness.torch_error, inputs=InputCache(), phases=phases
    )
    assert res.status == "ok"
    assert {"correctness", "operands", "timing_capture"} <= set(phases)
    assert all(v >= 0 for v in phases.values())
