"""The typed records at the seams: statuses, jobs and their answers, reuse keys."""

from __future__ import annotations

import dataclasses
import json

import pytest

from cudal2.generator import design_name, design_space
from cudal2.records import (
    STATUSES,
    Job,
    JobKind,
    JobResult,
    Measurement,
    Status,
    Target,
    TimingConfig,
    canonical_json,
    sha256_hex,
)


def test_status_spellings_are_those_of_the_recorded_databases():
    assert STATUSES == ("ok", "compile", "runtime", "incorrect", "timeout", "illegal", "sanitizer")
    assert [s.value for s in Status] == list(STATUSES)
    assert json.dumps(Status.TIMEOUT) == '"timeout"' and f"{Status.OK}" == "ok"


def test_a_measurement_keeps_its_json_and_types_its_status(recorded_measurements):
    for m in recorded_measurements[:50]:
        again = Measurement.from_json(json.loads(json.dumps(m.as_json())))
        assert again == m and type(again.status) is Status
    m = recorded_measurements[0]
    assert dataclasses.replace(m, status="incorrect").status is Status.INCORRECT
    with pytest.raises(ValueError):
        dataclasses.replace(m, status="bogus")


@pytest.mark.parametrize(
    "dtype, layout", [("fp16", "tn"), ("bf16", "tn"), ("fp16", "nn"), ("bf16", "nn")]
)
def test_design_keys_are_unchanged_by_the_faster_json(dtype, layout):
    """``as_json`` builds the dict directly instead of through ``dataclasses.asdict``:
    every design of the space keeps the key (and so the records keep their keys)."""
    for d in design_space("sm_90a", dtype, layout):
        old = dataclasses.asdict(d)
        old["knobs"] = dict(old["knobs"]["items"])
        assert d.key == sha256_hex(canonical_json(old))
    t = Target("sm_90a", dtype, layout, 100, 1000, 1000)
    # A plain target leaves out its epilogue (its JSON is what it was before epilogues)
    # and its heads (a field of ROPE_KV targets alone, after epilogues)
    left_out = ("epilogue", "heads")
    assert t.as_json() == {k: v for k, v in dataclasses.asdict(t).items() if k not in left_out}


def _jobs(m: Measurement) -> list[Job]:
    timing = TimingConfig(mode=m.mode, seed=3, server_gap_s=(1e-5, 2e-5))
    kernel = Job(
        JobKind.MEASURE,
        m.target,
        timing,
        m.toolchain,
        m.design,
        m.artifact_key,
        design_name(m.design),
    )
    kernel = dataclasses.replace(kernel, recipe={"tile_m": 64}, cubin="/c")
    return [
        kernel,
        dataclasses.replace(kernel, kind=JobKind.PROFILE),
        dataclasses.replace(kernel, kind=JobKind.SANITIZE, design=None),  # a fixture kernel
        Job(JobKind.AUTOTUNE, m.target, timing, "cublasLt 130100; timing v2"),
    ]


def test_jobs_and_answers_round_trip_through_json(recorded_measurements):
    m = next(x for x in recorded_measurements if x.design is not None and x.metrics)
    for job in _jobs(m):
        assert Job.from_json(json.loads(json.dumps(job.as_json()))) == job
        answers = [
            JobResult(
                job, Status.OK, "", 1e-3, 2e-3, m.samples_us, m.baseline_samples_us, m.metrics
            ),
            JobResult(job, Status.RUNTIME, "worker died", vendor={"algo": "ab"}),
            JobResult.not_recorded(job, "no record"),
            # answered on one GPU of several: the answer names it
            JobResult(job, Status.OK, gpu=dataclasses.replace(m.gpu, index=3, host="gpu-7")),
            # the worker's own seconds, by phase
            JobResult(job, Status.OK, job_s=0.05, phases_s={"correctness": 0.01}),
        ]
        for res in answers:
            again = JobResult.from_json(json.loads(json.dumps(res.as_json())))
            assert again == res and again.recorded == (res.status is not None)


def test_the_worker_s_seconds_travel_with_the_answer_and_never_into_a_record(
    recorded_measurements,
):
    """``job_s`` / ``phases_s`` cross the pipe (JSON) and stop there: the record made from
    the answer (kernel or cuBLASLt) has the metrics it had without them."""
    from cudal2.pipeline.results import measurement_from, vendor_measurement
    from cudal2.records import BuildResult

    m = next(x for x in recorded_measurements if x.design is not None and x.metrics)
    job = dataclasses.replace(_jobs(m)[0], recipe={"tile_m": 64, "tile_n": 64, "smem_bytes": 0})
    plain = JobResult(job, Status.OK, "", 1e-3, 2e-3, m.samples_us, m.baseline_samples_us, {"x": 1})
    timed = dataclasses.replace(plain, job_s=0.05, phases_s={"timing_replay": 0.03})
    wire = json.loads(json.dumps(timed.as_json()))
    assert wire["job_s"] == 0.05 and wire["phases_s"] == {"timing_replay": 0.03}
    assert "job_s" not in plain.as_json() and "phases_s" not in plain.as_json()
    build = BuildResult(m.design.key, m.artifact_key, True, design_name(m.design))
    got = measurement_from(JobResult.from_json(wire), build, m.gpu, "test")
    want = measurement_from(plain, build, m.gpu, "test")
    assert got.as_json().keys() == want.as_json().keys()
    assert got.metrics == want.metrics and "job_s" not in json.dumps(got.as_json())
    vjob = _jobs(m)[3]
    vendor = {"library": "cublaslt", "algo": "ab", "version": 130100, "workspace_bytes": 0}
    v = JobResult(
        vjob, Status.OK, "", 1e-3, 2e-3, m.samples_us, m.baseline_samples_us, vendor=vendor
    )
    vtimed = dataclasses.replace(v, job_s=0.4, phases_s={"autotune": 0.3})
    assert vendor_measurement(vtimed, m.gpu).metrics == vendor_measurement(v, m.gpu).metrics
    assert "phases_s" not in json.dumps(vendor_measurement(vtimed, m.gpu).as_json())


def test_a_gpu_tag_travels_with_the_record_and_untagged_records_keep_their_shape(
    recorded_measurements,
):
    m = next(x for x in recorded_measurements if x.design is not None)
    assert "index" not in m.gpu.as_json() and "host" not in m.gpu.as_json()
    assert m.gpu.where == m.gpu.name
    tagged = dataclasses.replace(m, gpu=dataclasses.replace(m.gpu, index=0, host="node-1"))
    line = json.loads(json.dumps(tagged.as_json()))
    assert line["gpu"]["index"] == 0 and line["gpu"]["host"] == "node-1"
    again = Measurement.from_json(line)
    assert again.gpu == tagged.gpu and again.reuse_key == m.reuse_key  # the tag keys nothing
    assert again.gpu.where == f"{m.gpu.name} (node-1:0)"


def test_a_jobs_reuse_key_is_its_records(recorded_measurements):
    kernel = next(x for x in recorded_measurements if x.design is not None)
    job = _jobs(kernel)[0]
    assert job.reuse_key(kernel.gpu.name) == kernel.reuse_key
    vendor = next(x for x in recorded_measurements if x.is_vendor)
    tune = Job(JobKind.AUTOTUNE, vendor.target, TimingConfig(mode=vendor.mode), vendor.toolchain)
    assert tune.reuse_key(vendor.gpu.name) == vendor.tuning_key != vendor.reuse_key


def test_a_kernel_job_names_its_artifact_and_symbol():
    t = Target("sm_90a", "fp16", "tn", 1, 8, 8)
    with pytest.raises(ValueError, match="artifact key and a symbol"):
        Job(JobKind.MEASURE, t, TimingConfig(), "nvcc")


def _rival_job(recorded_measurements, **rival_changes):
    """A run-off's job from the recorded database: its first plain kernel record's
    ``measure`` job with its target's first cuBLASLt record as the rival."""
    from cudal2.pipeline.runoff import runoff_job

    vendor = next(x for x in recorded_measurements if x.is_vendor)
    kernel = next(x for x in recorded_measurements if x.design and x.target == vendor.target)
    job = runoff_job(kernel, vendor, "k.cubin", TimingConfig(mode=kernel.mode))
    return kernel, vendor, dataclasses.replace(job, rival={**job.rival, **rival_changes})


def test_a_run_off_job_carries_its_rival_and_keeps_the_kernels_key(recorded_measurements):
    kernel, vendor, job = _rival_job(recorded_measurements)
    assert job.rival["design_key"] == vendor.design_key
    assert bytes.fromhex(job.rival["algo"]) == bytes.fromhex(vendor.vendor["algo"])
    assert Job.from_json(json.loads(json.dumps(job.as_json()))) == job
    assert job.reuse_key(kernel.gpu.name) == kernel.reuse_key  # its answer stands for the key
    plain = dataclasses.replace(job, rival={})
    assert "rival" not in plain.as_json()  # a plain job's JSON keeps its bytes


# Rivals a run-off refuses: (what changes in the job, what the error names)
HOSTILE_RIVALS = [
    ({"rival": {"design_key": "cublaslt:x"}}, "missing"),
    ({"rival": {"design_key": "abc", "library": "cublaslt", "version": 1, "algo": "00"}}, "'abc'"),
    ({"kind": JobKind.PROFILE}, "plain target's measure job"),
    ({"target": Target("sm_90a", "fp16", "tn", 64, 4096, 4096, epilogue="bias")}, "bias"),
]


@pytest.mark.parametrize(("change", "error"), HOSTILE_RIVALS)
def test_a_rival_that_is_no_cublaslt_algorithm_of_a_plain_measure_job_is_refused(
    recorded_measurements, change, error
):
    _, _, job = _rival_job(recorded_measurements)
    fields = {**job.__dict__, **change}
    with pytest.raises(ValueError, match=error):
        Job(**fields)
