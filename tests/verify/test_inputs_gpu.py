"""On a GPU: the worker's kept inputs (``cudal2.verify.inputs.InputCache``) change no
answer. A mixed batch of honest and adversarial kernels (tests/verify/fixtures/), run
through ``worker.run_job`` as the measuring worker runs it, once with every trial and
timing set drawn afresh and once through one cache: the same statuses and the same
errors (the racy kernel's count of differing elements is its own coin flips: its
status and the kind of failure are compared)."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest

from cudal2.records import Job, JobKind, Status, Target, TimingConfig

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU"),
    pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc"),
]

TARGETS = [
    Target("sm_90a", "fp16", "tn", 100, 136, 264),
    Target("sm_90a", "fp16", "tn", 64, 512, 1024),
]
BATCH = [
    ("fx_honest", ""),
    ("fx_skipped_work", "bound"),
    ("fx_writes_input", "wrote into its input(s) a"),
    ("fx_honest", ""),
    ("fx_partial_write", "not written"),
    ("fx_cached_result", "trial 1"),
    ("fx_nan_output", "not written (or NaN)"),
    ("fx_racy", "a race"),
    ("fx_honest", ""),
]


def _job(adversarial: tuple[Path, dict], t: Target, symbol: str) -> Job:
    """A measure job of one fixture kernel (``adversarial``: tests/verify/conftest.py)."""
    cubin, recipe = adversarial
    return Job(
        JobKind.MEASURE,
        t,
        TimingConfig(reps=5),
        toolchain="fixture",
        artifact_key=f"fixture:{symbol}",
        symbol=symbol,
        recipe=recipe,
        cubin=str(cubin),
    )


@pytest.mark.parametrize("t", TARGETS, ids=lambda t: t.label)
def test_a_mixed_batch_answers_alike_with_and_without_the_cache(adversarial, t):
    from cudal2.packaging.runtime import driver
    from cudal2.verify import correctness, worker
    from cudal2.verify.gpu import current_gpu
    from cudal2.verify.inputs import InputCache
    from cudal2.verify.spread import VendorSpread, nvmath_available

    torch.cuda.init()
    driver.ensure_context(0)
    gpu = current_gpu(0)
    errors = VendorSpread() if nvmath_available() else correctness.torch_error
    cache = InputCache()
    for symbol, needle in BATCH:
        job = _job(adversarial, t, symbol)
        fresh = worker.run_job(job, 0, gpu.name, errors)
        kept = worker.run_job(job, 0, gpu.name, errors, cache)
        assert kept.status == fresh.status, (symbol, fresh.error, kept.error)
        if needle:
            assert kept.status == Status.INCORRECT and needle in kept.error, (symbol, kept.error)
            assert needle in fresh.error, (symbol, fresh.error)
        else:
            assert kept.status == Status.OK, (symbol, kept.error)
            assert len(kept.samples_us) == len(fresh.samples_us) == 5
        if symbol != "fx_racy":
            assert kept.error == fresh.error, symbol
            assert (kept.max_abs_err, kept.metrics) == (fresh.max_abs_err, fresh.metrics), symbol
    stats = cache.stats()
    assert stats["hits"] > 0 and stats["bytes"] <= cache.max_bytes
    # the write into A dropped the trial it wrote; the kept ones are as drawn
    assert stats["redrawn"] == 0


# -- torch's graph kept per target (verify/inputs.py ``baseline``) ---------------------
def _started():
    from cudal2.packaging.runtime import driver
    from cudal2.verify import correctness
    from cudal2.verify.gpu import current_gpu
    from cudal2.verify.spread import VendorSpread, nvmath_available

    torch.cuda.init()
    driver.ensure_context(0)
    return current_gpu(0), VendorSpread() if nvmath_available() else correctness.torch_error


@pytest.mark.parametrize("t", TARGETS, ids=lambda t: t.label)
def test_torch_timed_from_the_kept_graph_reads_as_when_captured_in_the_job(adversarial, t):
    """An honest kernel's jobs, alternately without and with the cache (whose later jobs
    replay torch's graph captured by its first): torch's median the same within the
    noise of the samples (their p20-p80 spread, at least 5%), and the candidate's too."""
    from cudal2.verify import worker
    from cudal2.verify.inputs import InputCache
    from cudal2.verify.timing import Timing

    gpu, errors = _started()
    cache = InputCache()
    job = dataclasses.replace(_job(adversarial, t, "fx_honest"), timing=TimingConfig())
    fresh, kept = [], []
    for _ in range(4):
        fresh.append(worker.run_job(job, 0, gpu.name, errors))
        kept.append(worker.run_job(job, 0, gpu.name, errors, cache))
    assert all(r.status == Status.OK for r in fresh + kept)
    assert sum(k[0] == "graph" for k in cache._kept) == 1  # one graph, replayed by 3 jobs
    for name, of in (("torch", lambda r: r.baseline_samples_us["torch"]), ("kernel", None)):
        pick = of or (lambda r: r.samples_us)
        a = Timing(tuple(x for r in fresh for x in pick(r)))
        b = Timing(tuple(x for r in kept[1:] for x in pick(r)))
        noise = max(a.spread, b.spread, 0.05)
        assert abs(b.median_us - a.median_us) / a.median_us <= noise, (name, a, b)
    # (printed: each kept job's capture seconds; the first captured torch's graph too)
    caps = [r.phases_s["timing_capture"] for r in kept]
    assert all(r.job_s and r.job_s >= sum(r.phases_s.values()) * 0.99 for r in kept)
    print(f"{t.label}: timing_capture s, kept graph: {caps}")


EPILOGUE = Target("sm_90a", "fp16", "tn", 256, 1024, 512, epilogue="bias_residual")
GATED = Target("sm_90a", "fp16", "tn", 64, 2048, 512, epilogue="rmsnorm_silu")


@pytest.mark.parametrize("t", [TARGETS[1], EPILOGUE, GATED], ids=lambda t: t.label)
def test_a_kept_graph_outlives_what_later_jobs_free_and_eviction_frees_it(t):
    """torch's graph, kept, replayed after other jobs' tensors came and went: its
    outputs are torch's eager results on the kept sets (it read and wrote only what the
    cache keeps); dropped with its target, its memory is given back."""
    import gc

    from cudal2.verify import correctness, worker
    from cudal2.verify.inputs import InputCache
    from cudal2.verify.timing import operand_sets, replay_calls

    gpu, _ = _started()
    cfg = TimingConfig()
    nsets = operand_sets(t.min_bytes)
    calls = replay_calls(nsets, cfg, 10.0)
    torch.cuda.synchronize()
    gc.collect()
    before = torch.cuda.memory_allocated()
    cache = InputCache()
    g = cache.baseline(t, cfg, nsets, calls, lambda s: worker.torch_graph(t, s, nsets, calls))
    sets, outs = g.keep
    mid = torch.cuda.memory_allocated()
    own = sum(x.numel() * x.element_size() for x in outs)
    assert mid - before >= sets.nbytes + own and cache.bytes >= sets.nbytes + own
    for _ in range(3):  # later jobs: their own tensors, freed and reused
        junk = [torch.randn(t.m, t.k, device="cuda") for _ in range(8)]
        del junk
        torch.cuda.empty_cache()
    for x in outs:
        x.fill_(float("nan"))
    g.graph.replay()
    torch.cuda.synchronize()
    for j in range(min(nsets, calls)):
        a, b = sets.sets[j]
        want = correctness.vendor(t, a, b, epi=sets.epis[j])
        assert not torch.isnan(outs[j]).any(), j  # every output written by the replay
        # (bit for bit but for cuBLAS's choices on another stream: within a few roundings)
        err = float((outs[j].float() - want.float()).abs().max())
        assert err <= 8 * correctness.OUT_EPS[t.dtype] * float(want.float().abs().max()), j
    sets_bytes = sets.nbytes
    del g, sets, outs, a, b, want, x
    cache.drop_target(t)
    gc.collect()
    torch.cuda.synchronize()
    assert cache.bytes == 0
    # given back: the sets and the outputs (a cuBLAS workspace made for the capture's
    # stream stays with torch, whoever captured)
    assert torch.cuda.memory_allocated() <= mid - (sets_bytes + own)
