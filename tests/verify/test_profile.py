"""Profile metrics (CPU side), replayed from an ncu report recorded on the H100
(``tests/verify/data/ncu-h100-*``, written by ``ci/record_ncu.py``)."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
from pathlib import Path

import pytest

from cudal2.verify import profile as prof

DATA = Path(__file__).parent / "data"
RAW = (DATA / "ncu-h100-raw.csv").read_text()
RECORD = json.loads((DATA / "ncu-h100-profile.json").read_text())


def test_report_parses_to_the_recorded_metrics_in_launch_order():
    rows = prof.parse_raw_csv(RAW, RECORD["names"])
    assert rows == RECORD["metrics"]
    # One row per job, in job order: the report's kernel names are the jobs' symbols.
    table = [r for r in csv.DictReader(io.StringIO(RAW)) if r["ID"].isdigit()]
    assert [r["Kernel Name"] for r in table] == [j["symbol"] for j in RECORD["jobs"]]


def test_every_quantity_was_found_on_the_h100_with_its_first_name():
    assert RECORD["names"] == {k: v[0] for k, v in prof.METRICS.items()}
    for vals in RECORD["metrics"]:
        assert set(vals) == set(prof.METRICS)
        assert all(0 <= v <= 100.5 for k, v in vals.items() if k.endswith("_pct"))


def test_a_metric_missing_from_the_report_is_absent_not_zero():
    names = dict(RECORD["names"], ncu_bogus="no__such_metric.sum")
    rows = prof.parse_raw_csv(RAW, names)
    assert all("ncu_bogus" not in r for r in rows)
    assert [{k: v for k, v in r.items()} for r in rows] == RECORD["metrics"]


def test_text_without_a_report_is_an_error():
    with pytest.raises(ValueError, match="no ncu CSV header"):
        prof.parse_raw_csv((DATA / "ncu-h100-log.txt").read_text(), RECORD["names"])


def test_no_ncu_gives_empty_metrics_and_says_why(monkeypatch):
    monkeypatch.setattr(prof, "find_ncu", lambda: None)
    res = prof.profile([{"cubin": "x", "symbol": "y", "recipe": {}, "target": {}}])
    assert res.metrics == [{}] and "ncu not found" in res.error


def test_build_records_profiled_copies_and_feeds_them_on(tmp_path, recorded_measurements):
    """The build profiles each target's fastest candidates and appends enriched copies
    of their records; the proposer receives the enriched ones. The runner replays the
    recorded ncu report's metrics as if ncu had measured them."""
    import dataclasses

    from cudal2.database import MeasurementDB, latest
    from cudal2.generator.compile import ArtifactCache
    from cudal2.manifest import default_manifest_path, load_manifest
    from cudal2.pipeline.build import Build
    from cudal2.verify.replay import ReplayRunner

    unprofiled = [  # kernel records (cuBLASLt ones have nothing to profile)
        m
        for m in latest(recorded_measurements)
        if not m.is_vendor and not any("ncu_" in k for k in m.metrics)
    ]
    target = next(m.target for m in unprofiled if m.status == "ok")
    ms = [m for m in unprofiled if m.target == target]
    n = len(RECORD["metrics"])
    assert len(ms) > n
    fastest = sorted(ms, key=lambda m: (m.median_us, m.design_key))[:n]
    profiled = [
        dataclasses.replace(m, metrics={**m.metrics, **vals})
        for m, vals in zip(fastest, RECORD["metrics"], strict=True)
    ]
    runner = ReplayRunner(profiled)
    b = Build(
        load_manifest(default_manifest_path()),
        tmp_path / "db.jsonl",
        ArtifactCache(tmp_path / "cache"),
        tmp_path / "dist",
        log=io.StringIO(),
    )
    out = b._profile(runner, runner.start(), ms, n)
    written = MeasurementDB(tmp_path / "db.jsonl").read()
    assert [w.reuse_key for w in written] == [m.reuse_key for m in fastest]
    for w, vals in zip(written, RECORD["metrics"], strict=True):
        # the default manifest's profile_metrics: the search's quantities, no more
        asked = {k: v for k, v in vals.items() if k in prof.SEARCH_QUANTITIES}
        assert {k: v for k, v in w.metrics.items() if k in prof.METRICS} == asked
    assert len(out) == len(ms) and sum(w in out for w in written) == n
    assert b._profile(runner, runner.start(), out, n) == out  # already profiled: nothing again


@pytest.mark.parametrize("error", ["", "ncu: exit 1"])
def test_the_local_runner_profiles_a_batch_in_one_ncu_run(
    monkeypatch, recorded_measurements, error
):
    """Profile jobs of one ``run`` share one ncu run; its metrics come back per job, in
    job order, and a failed run answers every job with its error (no verdict on them)."""
    from cudal2.pipeline.results import job_for
    from cudal2.records import JobKind, Status
    from cudal2.verify import local

    kernels = [m for m in recorded_measurements if m.design is not None]
    jobs = [job_for(JobKind.PROFILE, m, f"/c/{m.artifact_key}") for m in kernels[:3]]
    calls = []

    def fake_profile(batch, device=None, wanted=()):
        calls.append(batch)
        return prof.ProfileResult([RECORD["metrics"][i] for i in range(len(batch))], error)

    monkeypatch.setattr(local, "profile", fake_profile)
    answers = list(local.LocalRunner().run(jobs))
    assert len(calls) == 1 and [j["symbol"] for j in calls[0]] == [j.symbol for j in jobs]
    assert [a.job for a in answers] == jobs
    if error:
        assert all(a.status == Status.RUNTIME and a.error == error for a in answers)
    else:
        assert [a.metrics for a in answers] == RECORD["metrics"][:3]
        assert all(a.status == Status.OK for a in answers)


FAKE_NCU = r'''#!{python}
"""A stand-in for ncu: refuses the metric names listed in $FAKE_NCU_UNKNOWN as ncu
does, prints the recorded report on --import, logs each call's metrics."""
import json, os, sys
from pathlib import Path
args = sys.argv[1:]
if "--import" in args:
    print(Path(os.environ["FAKE_NCU_RAW"]).read_text(), end="")
    sys.exit(0)
metrics = args[args.index("--metrics") + 1].split(",")
with open(os.environ["FAKE_NCU_CALLS"], "a") as f:
    f.write(json.dumps(metrics) + "\n")
bad = [m for m in metrics if m in os.environ["FAKE_NCU_UNKNOWN"].split(",")]
for m in bad:
    print(f"==ERROR== Failed to find metric '{m}'")
if not bad:  # the child ran: its phases, and ncu's lines as the H100 printed them
    Path(args[-1]).write_text(json.dumps({"imports": 1.5, "cuda_init": 0.5, "launches": 2.0}))
    print(Path(os.environ["FAKE_NCU_LOG"]).read_text(), end="", file=sys.stderr)
sys.exit(1 if bad else 0)
'''


@pytest.fixture
def fake_ncu(tmp_path, monkeypatch):
    import sys

    exe = tmp_path / "ncu"
    exe.write_text(FAKE_NCU.replace("{python}", sys.executable))
    exe.chmod(0o755)
    calls = tmp_path / "calls.jsonl"
    monkeypatch.setenv("FAKE_NCU_CALLS", str(calls))
    monkeypatch.setenv("FAKE_NCU_RAW", str(DATA / "ncu-h100-raw.csv"))
    monkeypatch.setenv("FAKE_NCU_LOG", str(DATA / "ncu-h100-log.txt"))
    monkeypatch.setattr(prof, "find_ncu", lambda: str(exe))
    monkeypatch.setattr(prof, "_UNKNOWN", {})
    return lambda: [json.loads(x) for x in calls.read_text().splitlines()]


def test_a_metric_ncu_refuses_costs_one_run_per_process_not_per_round(
    fake_ncu, monkeypatch, capsys
):
    """A refused name is dropped for the next one (a run each time); the next profiling
    call of the process starts without it. Each call's seconds are in the result (the
    ncu runs, the child's phases, the report import) and on one stderr line."""
    first = prof.METRICS["ncu_tensor_pct"][0]
    monkeypatch.setenv("FAKE_NCU_UNKNOWN", first)
    jobs = RECORD["jobs"]
    res = prof.profile(jobs)
    # (the recorded report, which has the first name's column only)
    want = [{k: v for k, v in m.items() if k != "ncu_tensor_pct"} for m in RECORD["metrics"]]
    assert res.error == "" and res.metrics == want
    assert res.names["ncu_tensor_pct"] == prof.METRICS["ncu_tensor_pct"][1]
    calls = fake_ncu()
    assert len(calls) == 2 and first in calls[0] and first not in calls[1]
    assert set(res.seconds) >= {"ncu_run_1", "ncu_run_2", "import", "child_imports"}
    assert res.seconds["child_launches"] == 2.0
    line = capsys.readouterr().err
    assert "ncu: 3 kernels, 2 run(s)" in line and "imports 1.5" in line and first in line
    again = prof.profile(jobs)  # the next round
    assert len(fake_ncu()) == 3 and first not in fake_ncu()[2]
    assert set(again.seconds) >= {"ncu_run_1", "import"} and "ncu_run_2" not in again.seconds


def test_the_ncu_command_keeps_the_clocks_and_profiles_only_the_candidates(tmp_path):
    cmd = prof.ncu_command(
        "ncu", ["a.sum", "b.pct"], tmp_path / "r", tmp_path / "j", tmp_path / "p", 24
    )

    def opt(name: str) -> str:
        return cmd[cmd.index(name) + 1]

    assert opt("--clock-control") == "none"  # measured as found, never locked
    assert opt("--cache-control") == "all" and opt("--replay-mode") == "kernel"
    assert opt("--kernel-name") == f"regex:^{prof.KERNEL_PREFIX}"
    assert opt("--launch-count") == "24" and opt("--metrics") == "a.sum,b.pct"
    assert opt("--target-processes") == "application-only"
    assert cmd[-3:] == ["cudal2.verify.profile", str(tmp_path / "j"), str(tmp_path / "p")]


def test_ncu_s_replay_passes_per_kernel_are_read_from_its_log(fake_ncu, monkeypatch, capsys):
    """The H100's log of the 7 quantities: 9 passes per kernel, on the summary line."""
    log = (DATA / "ncu-h100-log.txt").read_text()
    assert prof.passes_of(log) == [9, 9, 9]
    assert prof.passes_of('==PROF== Profiling "k" - 0: 0%....50%....100% - 1 pass\n') == [1]
    monkeypatch.setenv("FAKE_NCU_UNKNOWN", "")
    res = prof.profile(RECORD["jobs"])
    assert res.passes == [9, 9, 9]
    line = capsys.readouterr().err
    assert line.startswith("ncu: 3 kernels, 1 run(s) ") and " s, 9 passes per kernel (child" in line


@pytest.mark.parametrize("choice", ["search", "all"])
def test_the_metric_set_is_what_ncu_is_asked_for_and_what_comes_back(fake_ncu, monkeypatch, choice):
    """``search``: only the quantities the search reads (fewer counters, fewer replay
    passes); ``all``: every one. The answer carries what was asked, nothing else."""
    monkeypatch.setenv("FAKE_NCU_UNKNOWN", "")
    wanted = prof.quantities(choice)
    res = prof.profile(RECORD["jobs"], wanted=wanted)
    (call,) = fake_ncu()
    assert sorted(call) == sorted(prof.METRICS[q][0] for q in wanted)
    assert res.metrics == [{k: v for k, v in m.items() if k in wanted} for m in RECORD["metrics"]]
    if choice == "search":
        assert len(call) == 3 and "sm__throughput.avg.pct_of_peak_sustained_elapsed" not in call


def test_an_unknown_metric_set_or_quantity_is_refused():
    with pytest.raises(ValueError, match="unknown profile metric set 'some'"):
        prof.quantities("some")
    with pytest.raises(ValueError, match="unknown Nsight Compute quantities"):
        prof.profile(RECORD["jobs"], wanted=("ncu_bogus",))


def test_the_search_set_holds_everything_the_search_reads(recorded_measurements):
    """What the proposers read of a profile (``policy.reward.entry``) is the same from
    the search set as from all seven quantities, for every recorded profile."""
    from cudal2.policy.corpus import Row
    from cudal2.policy.reward import entry
    from cudal2.policy.tokens import gpu_features

    gpu = gpu_features("NVIDIA H100 80GB HBM3")
    ms = [m for m in recorded_measurements if m.design is not None and m.status == "ok"][:5]
    assert len(ms) == 5
    checked = 0
    for m in ms:
        row = Row(m.target, m.design, "ok", m.median_us, 2.0 * m.median_us, m.gpu.name,
                  m.proposer, 0.5, dict(m.metrics), 1000)  # fmt: skip
        for vals in RECORD["metrics"]:
            full = dataclasses.replace(row, metrics={**row.metrics, **vals})
            few = {k: v for k, v in vals.items() if k in prof.SEARCH_QUANTITIES}
            part = dataclasses.replace(row, metrics={**row.metrics, **few})
            assert entry(full, 0.0, gpu) == entry(part, 0.0, gpu)
            assert entry(full, 0.0, gpu) != entry(row, 0.0, gpu)  # the profile is read
            checked += 1
    assert checked == 15
    assert set(prof.SEARCH_QUANTITIES) <= set(prof.METRICS)
