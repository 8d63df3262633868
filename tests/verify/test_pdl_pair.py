"""The PDL pair check's plumbing on CPU (the check itself runs on a GPU:
tests/verify/test_adversarial_gpu.py and ci/gpu_pdl.sh): a PDL recipe asks the worker
for it, a failure is an ``incorrect`` answer that is never timed, its outcome is a
metric of the record, the record passes the database schema, and a replay answers
the same rejection (a rejected kernel stays rejected)."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess

import pytest

from cudal2.database import MeasurementDB
from cudal2.generator import design_name, launch_recipe
from cudal2.generator.families.base import with_pdl
from cudal2.pipeline.results import kernel_job, measurement_from
from cudal2.records import BuildResult, GpuInfo, JobResult, Status, Target, TimingConfig
from cudal2.verify import correctness, pdl_pair, worker
from cudal2.verify.replay import ReplayRunner

GPU = GpuInfo("NVIDIA H100 80GB HBM3", "sm_90a", 132, "580.00", "13.0")
TARGET = Target("sm_90a", "fp16", "tn", 16, 4096, 4096)
EARLY = (
    "PDL pair check, round 1: 4096 of 65536 output elements differ from a plain run's "
    "(4096 NaN): A was read before griddepcontrol.wait"
)


def _pdl_job(tmp_path, trigger: str = "entry"):
    from cudal2.generator.families import sm90_direct

    d = with_pdl(sm90_direct.design("sm_90a", "fp16", "tn", 16, 4, 2, 128, 2, 1), trigger)
    build = BuildResult(d.key, "a" * 64, True, design_name(d), registers=96, spill_bytes=0)
    cubin = tmp_path / "k.cubin"
    cubin.write_bytes(b"\x7fELF not really")
    return kernel_job(TARGET, d, build, TimingConfig(reps=5), str(cubin)), build


def test_a_pdl_recipe_asks_for_the_pair_check_a_plain_one_does_not(tmp_path, monkeypatch):
    asked = []
    monkeypatch.setattr(
        worker,
        "_check_and_time",
        lambda job, run, gpu, errs, **kw: asked.append(kw) or JobResult(job, Status.OK),
    )
    job, _ = _pdl_job(tmp_path)
    assert job.recipe["pdl"] is True
    worker.run_job(job, 0, GPU.name, correctness.torch_error)
    plain = dataclasses.replace(job, recipe={**job.recipe, "pdl": False})
    worker.run_job(plain, 0, GPU.name, correctness.torch_error)
    assert [kw["pdl_pair_check"] for kw in asked] == [True, False]


class _NoGpuTorch:
    """The parts of torch ``_check_and_time`` touches before timing."""

    class Generator:
        def __init__(self, device=None):
            pass

        def manual_seed(self, seed):
            return self


@pytest.mark.parametrize("ok", [False, True])
def test_the_worker_records_the_pair_check_and_times_only_a_pass(tmp_path, monkeypatch, ok):
    import sys

    job, _ = _pdl_job(tmp_path)
    monkeypatch.setitem(sys.modules, "torch", _NoGpuTorch)
    passed = correctness.CheckResult(True, "", 0.01, 0.001)
    monkeypatch.setattr(correctness, "check", lambda *a, **k: passed)
    verdict = pdl_pair.PairVerdict(ok, "" if ok else EARLY)
    monkeypatch.setattr(pdl_pair, "check", lambda *a, **k: verdict)

    class Timed(Exception):
        pass

    def timing(*a, **k):
        raise Timed

    monkeypatch.setattr(worker, "operand_sets", timing)
    if ok:
        with pytest.raises(Timed):  # a pass goes on to be timed
            worker._check_and_time(job, None, GPU.name, None, pdl_pair_check=True)
        return
    res = worker._check_and_time(job, None, GPU.name, None, pdl_pair_check=True)
    assert res.status == Status.INCORRECT and res.error == EARLY and res.samples_us == ()
    assert res.metrics[pdl_pair.PAIR_METRIC] == 0.0


def test_a_pair_check_failure_is_recorded_and_stays_rejected(tmp_path):
    job, build = _pdl_job(tmp_path)
    checked = JobResult(job, Status.INCORRECT, max_abs_err=0.01, max_rel_err=0.001)
    failed = pdl_pair.recorded(checked, pdl_pair.PairVerdict(False, EARLY))
    assert failed.status == Status.INCORRECT and failed.error == EARLY
    passed = pdl_pair.recorded(checked, pdl_pair.PairVerdict(True))
    assert passed.metrics[pdl_pair.PAIR_METRIC] == 1.0 and passed.error == ""

    m = measurement_from(failed, build, GPU, "test")
    assert m.status == Status.INCORRECT and m.metrics[pdl_pair.PAIR_METRIC] == 0.0
    db = MeasurementDB(tmp_path / "db.jsonl")
    db.append([m])  # through the schema, as every record
    (back,) = db.load().measurements
    assert back.metrics[pdl_pair.PAIR_METRIC] == 0.0 and back.error == EARLY

    (answer,) = ReplayRunner([back]).run([job])
    assert answer.status == Status.INCORRECT and answer.error == EARLY
    assert answer.metrics[pdl_pair.PAIR_METRIC] == 0.0


def test_the_producer_recipe_is_launched_plainly_and_the_candidate_with_pdl():
    """The pair: the producer triggers its dependents at entry (it is the primary);
    the candidate is the secondary, launched by its recipe (``pdl`` true)."""
    text = pdl_pair.PRODUCER_PTX
    body = text[text.index("{") :]
    assert body.index("griddepcontrol.launch_dependents") < body.index("SPIN:")
    # C is checked before A is written: a candidate that waits sees neither change.
    assert body.index("ld.volatile.global.u16") < body.index("st.global.u16")
    from cudal2.generator.families import sm90_direct

    d = sm90_direct.design("sm_90a", "fp16", "tn", 16, 4, 2, 128, 2, 1)
    assert launch_recipe(with_pdl(d, "entry"))["pdl"] is True


@pytest.mark.skipif(shutil.which("ptxas") is None, reason="needs ptxas")
def test_the_producer_ptx_assembles_for_sm_90(tmp_path):
    """The driver JIT-compiles the producer on the measuring side; ptxas here proves
    the PTX string is valid (griddepcontrol needs sm_90)."""
    ptx = tmp_path / "producer.ptx"
    ptx.write_text(pdl_pair.PRODUCER_PTX)
    subprocess.run(
        ["ptxas", "-arch=sm_90", "-o", str(tmp_path / "p.cubin"), str(ptx)],
        check=True,
        capture_output=True,
    )
