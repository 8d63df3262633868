"""compute-sanitizer gating (CPU side): the problem it runs, and what a failure does."""

from __future__ import annotations

import pytest

from cudal2.records import Status, Target
from cudal2.verify import sanitizer


@pytest.mark.parametrize("shape", [(4096, 4096, 4096), (1, 4096, 14336), (100, 1000, 1000)])
def test_small_problem_keeps_residues_and_alignment(shape):
    t = Target("sm_90a", "fp16", "nn", *shape)
    s = sanitizer.small(t)
    assert s.m <= 130 and s.n <= 144 and s.k <= 264
    assert s.k % 8 == 0 and s.n % 8 == 0  # the nn alignment rule still holds
    assert s.n % 16 == t.n % 16 and (s.n == t.n or s.n > 128)  # a partial 128-column tile
    assert (s.dtype, s.layout) == (t.dtype, t.layout)
    assert s.m == min(t.m, 130)


def test_missing_tool_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setattr(sanitizer, "find_sanitizer", lambda: None)
    with pytest.raises(FileNotFoundError, match="compute-sanitizer"):
        sanitizer.memcheck(tmp_path / "k.cubin", "k", {}, Target("sm_90a", "fp16", "tn", 1, 8, 8))


def test_a_memcheck_is_announced_then_its_verdict_recorded_once_per_build(
    tmp_path, recorded_measurements
):
    """The gate announces a check (a ``started`` line) before the runner runs it, then
    records the runner's verdict under the same id; the failure vetoes the artifact
    (the gate reads the event, not the text), and a key is checked once per build.
    The runner is a replay standing in for memcheck on the GPU."""
    from cudal2.database import MeasurementDB, latest
    from cudal2.pipeline.gate import SanitizerGate, check_key
    from cudal2.pipeline.select import select
    from cudal2.records import CheckEvent, JobKind, JobResult
    from cudal2.verdicts import SanitizerLedger
    from cudal2.verify.replay import ReplayRunner

    targets = sorted({m.target for m in recorded_measurements})
    sels, _ = select(targets, latest(recorded_measurements), "offline")
    best = next(s.winner for s in sels if s.kind == "kernel")  # a kernel that would ship
    report = "memcheck exited 86:\nInvalid __global__ write of size 2"

    class Memcheck(ReplayRunner):  # stands in for compute-sanitizer on a GPU
        asked: list = []

        def answer(self, job):
            if job.kind != JobKind.SANITIZE:
                return super().answer(job)
            self.asked.append(job)
            failed = job.artifact_key == best.artifact_key
            return JobResult(job, Status.SANITIZER if failed else Status.OK, report * failed)

    runner = Memcheck(recorded_measurements)
    db = MeasurementDB(tmp_path / "db.jsonl")
    gate = SanitizerGate(db, SanitizerLedger())
    same = [m for m in recorded_measurements if m.target == best.target]
    args = ([best.target], same, best.mode, lambda m: m.design is not None)
    kw = dict(runner=runner, gpu=runner.start(), cubins=lambda ms: {m.artifact_key: "" for m in ms})
    sels, _ = gate.select(*args, **kw)
    started, verdict, *_ = db.load().checks
    assert (started.event, verdict.event) == (CheckEvent.STARTED, CheckEvent.FAILED)
    assert started.check == verdict.check and verdict.error == report
    assert started.key == verdict.key == check_key(best)
    assert gate.ledger.vetoed(best.artifact_key) and gate.failed == {check_key(best)}
    assert sels[0].winner is None or sels[0].winner.artifact_key != best.artifact_key
    # Checked once per build: selecting again asks nothing new.
    asked = len(runner.asked)
    assert gate.select(*args, **kw) == (sels, [])
    assert len(runner.asked) == asked
    assert [j.artifact_key for j in runner.asked].count(best.artifact_key) == 1


def test_the_local_runner_answers_memcheck_with_a_status(monkeypatch, recorded_measurements):
    from cudal2.pipeline.results import job_for
    from cudal2.records import JobKind
    from cudal2.verify import local

    m = next(m for m in recorded_measurements if m.design is not None)
    job = job_for(JobKind.SANITIZE, m, "/nowhere/kernel.cubin")
    for ok, status in [(True, Status.OK), (False, Status.SANITIZER)]:
        res = sanitizer.SanitizerResult(ok, "" if ok else "memcheck exited 86:\n...")
        monkeypatch.setattr(local, "memcheck", lambda *a, res=res, **kw: res)
        (answer,) = local.LocalRunner().run([job])
        assert answer.job == job and answer.status == status and answer.error == res.report


def test_the_local_runner_memchecks_several_at_a_time(monkeypatch, recorded_measurements):
    """``sanitizer_parallel`` checks run at once (each a child process on the GPU); every
    job is answered, as it finishes, with the timeout passed down."""
    import threading
    import time

    from cudal2.pipeline.results import job_for
    from cudal2.records import JobKind
    from cudal2.verify import local

    kernels = [m for m in recorded_measurements if m.design is not None][:8]
    jobs = [job_for(JobKind.SANITIZE, m, f"/nowhere/{i}.cubin") for i, m in enumerate(kernels)]
    running, most, lock = [0], [0], threading.Lock()

    def fake(cubin, symbol, recipe, target, timeout_s, device=None):
        assert timeout_s == 42.0
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.1)
        with lock:
            running[0] -= 1
        return sanitizer.SanitizerResult(not str(cubin).endswith("3.cubin"), "report")

    monkeypatch.setattr(local, "memcheck", fake)
    runner = local.LocalRunner(sanitizer_parallel=4, sanitizer_timeout_s=42.0)
    answers = list(runner.run(jobs))
    assert most[0] == 4 and sorted(a.job.cubin for a in answers) == sorted(j.cubin for j in jobs)
    bad = [a for a in answers if a.status == Status.SANITIZER]
    assert [a.job.cubin for a in bad] == ["/nowhere/3.cubin"]


@pytest.mark.parametrize(
    "target",
    [
        Target("sm_90a", "fp16", "tn", 64, 28672, 4096, epilogue="rmsnorm_silu"),
        Target("sm_90a", "bf16", "tn", 1, 6144, 4096, epilogue="rmsnorm"),
        Target("sm_90a", "fp16", "tn", 300, 4096, 14336, epilogue="residual"),
        Target("sm_90a", "fp16", "tn", 3, 70, 40, epilogue="silu"),
        Target("sm_90a", "fp16", "tn", 2048, 28672, 4096, epilogue="silu"),
        Target("sm_90a", "bf16", "tn", 1024, 7000, 8192, epilogue="gelu_tanh"),
    ],
    ids=lambda t: t.label,
)
def test_the_checked_size_keeps_the_epilogue(target):
    """A fused kernel is checked with its epilogue's arguments: the cut target keeps it
    (and an even N for a gated one, whose output rows keep their 16-byte multiple where
    the target's have it: the gated TMA store's tensor map needs them)."""
    s = sanitizer.small(target)
    assert s.epilogue == target.epilogue
    assert (s.m, s.k) == (min(target.m, 130), min(target.k, 264))
    assert s.n <= 144 and s.n % 16 == target.n % 16
    assert s.out_n * 2 == s.n or s.epilogue not in ("silu", "rmsnorm_silu", "gelu_tanh")
    assert (s.out_n * 2) % 16 == (target.out_n * 2) % 16


@pytest.mark.parametrize(
    "target",
    [
        Target("sm_90a", "fp16", "tn", 130, 136, 264),
        Target("sm_90a", "bf16", "nn", 7, 24, 40),
        Target("sm_90a", "fp16", "tn", 16, 40, 96, epilogue="bias_residual"),
        Target("sm_90a", "bf16", "tn", 16, 40, 4096, epilogue="rmsnorm_silu"),
    ],
    ids=lambda t: t.label,
)
def test_the_childs_operands_are_the_working_dtypes_uniform_values(target):
    """The memcheck child makes its inputs on the host: each exactly the shape the
    kernel reads (its allocation is exactly that size), the working dtype's bits of
    uniform(-1, 1) values rounded as torch rounds them (a gated B scaled as in the
    trials)."""
    torch = pytest.importorskip("torch")
    from cudal2.records import EPILOGUE_OPERANDS
    from cudal2.verify.correctness import gated_b_scale, torch_dtype

    host = sanitizer.host_operands(target)
    b_shape = (target.n, target.k) if target.layout == "tn" else (target.k, target.n)
    shapes = {"a": (target.m, target.k), "b": b_shape, "bias": (target.n,)}
    shapes["residual"] = (target.m, target.n)
    assert set(host) == {"a", "b", *EPILOGUE_OPERANDS[target.epilogue]}
    rng = __import__("numpy").random.default_rng(0)
    for name, bits in host.items():
        assert bits.shape == shapes[name] and bits.dtype.itemsize == 2
        x = torch.from_numpy(rng.uniform(-1.0, 1.0, size=bits.shape).astype("float32"))
        if name == "b":
            x *= gated_b_scale(target)
        want = x.to(torch_dtype(target.dtype)).view(torch.int16).numpy().view("uint16")
        assert (bits == want).all(), name
    assert (host["a"] == sanitizer.host_operands(target)["a"]).all()  # the same every run


def test_the_child_runs_without_torch():
    """Importing what the memcheck child imports and making its operands loads no torch
    (its import and CUDA start-up were most of a memcheck's seconds)."""
    import subprocess
    import sys

    code = (
        "import sys; from cudal2.records import Target; "
        "from cudal2.verify import sanitizer, launch; from cudal2.packaging.runtime import driver; "
        "sanitizer.host_operands(Target('sm_90a', 'bf16', 'tn', 8, 16, 64, epilogue='residual')); "
        "from cuda.bindings import driver as cu; "
        "sys.exit(3 if 'torch' in sys.modules else 0)"
    )
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
    import inspect

    assert "torch" not in inspect.getsource(sanitizer._child)  # nor does the child itself
