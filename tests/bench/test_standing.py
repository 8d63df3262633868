"""The figures README.md and docs/ quote are generated from the committed results
(``cudal2-bench report``): the committed documents must equal what the results give."""

from __future__ import annotations

import gzip
import json
import shutil
import zipfile
from pathlib import Path

import pytest

from cudal2.bench import standing
from cudal2.cli import bench as bench_cli

ROOT = Path(__file__).resolve().parents[2]
GENERATED = (
    "README.md",
    "docs/inference.md",
    "docs/policy.md",
    "docs/measuring.md",
    "docs/kernels.md",
)

needs_nvcc = pytest.mark.skipif(
    shutil.which("nvcc") is None, reason="the selection renders designs to artifact keys"
)


@needs_nvcc
def test_committed_documents_equal_what_the_results_give(capsys):
    files = [str(ROOT / f) for f in GENERATED]
    code = bench_cli.main(["report", *files, "--check", "--root", str(ROOT)])
    assert code == 0, capsys.readouterr().err + "\nrun: cudal2-bench report " + " ".join(files)


@needs_nvcc
def test_a_hand_edited_figure_fails_the_check_and_report_restores_it(tmp_path, capsys):
    readme = tmp_path / "README.md"
    text = (ROOT / "README.md").read_text()
    edited = text.replace("| `default` | 32 | 2 (2) | 11 |", "| `default` | 32 | 3 (3) | 11 |")
    assert edited != text, "the README's block no longer has the default row this test edits"
    readme.write_text(edited)
    assert bench_cli.main(["report", str(readme), "--check", "--root", str(ROOT)]) == 1
    assert f"{readme}: its generated figures differ" in capsys.readouterr().err
    assert readme.read_text() == edited  # --check changes nothing
    assert bench_cli.main(["report", str(readme), "--root", str(ROOT)]) == 0
    assert readme.read_text() == text


def test_each_block_is_made_from_its_results_file(tmp_path):
    """Change the recorded result, and the generated figure changes with it."""
    (tmp_path / "bench" / "results").mkdir(parents=True)
    e2e = json.loads((ROOT / standing.E2E_RESULTS).read_text())
    e2e["cases"][0]["graph"]["speedup"] = 1.234
    (tmp_path / standing.E2E_RESULTS).write_text(json.dumps(e2e))
    table = standing.llama_e2e(tmp_path)
    assert "| **1.234** |" in table and "1.033" not in table


def test_the_pdl_table_is_made_from_its_results_files(tmp_path):
    """The PDL table and its pair-sample line follow the committed H100 results."""
    (tmp_path / "bench" / "results").mkdir(parents=True)
    timing = json.loads((ROOT / standing.PDL_TIMING).read_text())
    pairs = json.loads((ROOT / standing.PDL_PAIR).read_text())
    assert standing.pdl_timing(ROOT).count("\n| fp16/") == len(
        {r["target"] for r in timing["rows"]}
    )
    timing["rows"][0]["pdl_us"], timing["rows"][0]["plain_over_pdl"] = 99.9, 0.137
    pairs[0]["status"], pairs[0]["pair_check"] = "incorrect", 0.0
    (tmp_path / standing.PDL_TIMING).write_text(json.dumps(timing))
    (tmp_path / standing.PDL_PAIR).write_text(json.dumps(pairs))
    table = standing.pdl_timing(tmp_path)
    assert "| 99.9 (0.14) |" in table
    assert f"{len(pairs) - 1} of {len(pairs)} passed" in table


def test_the_eager_host_table_is_made_from_its_results_file(tmp_path):
    """The eager host table follows the committed H100 results: the paired ratio and
    what a linear call runs are read, not kept."""
    (tmp_path / "bench" / "results").mkdir(parents=True)
    d = json.loads((ROOT / standing.EAGER_HOST).read_text())
    d["forward"]["64"]["paired_unpatched_over_patched"] = 1.234
    d["linear"]["64"]["q_proj"]["served"] = "cublaslt cublaslt_x"
    (tmp_path / standing.EAGER_HOST).write_text(json.dumps(d))
    table = standing.eager_host(tmp_path)
    assert "| 64 | " in table and " | 1.234 (" in table
    row = next(line for line in table.splitlines() if line.startswith("| 64 |") and "/" in line)
    assert row.split(" | ")[1].endswith("cublaslt"), row


def test_the_pdl_public_table_is_made_from_its_results_file(tmp_path):
    """Counts and geomeans of the llm-public-with-PDL table come from the results rows."""
    (tmp_path / "bench" / "results").mkdir(parents=True)
    rows = [json.loads(x) for x in (ROOT / standing.PDL_PUBLIC).read_text().splitlines()]
    before = standing.pdl_public(ROOT)
    r = next(r for r in rows if r["mode"] == "server" and "_pdl_" in str(r["cudal2"]["dispatch"]))
    r["cudal2"]["dispatch"] = {"kind": "fallback", "kernel": None}
    r["cudal2"]["median_us"] = r["best_vendor"]["median_us"] / 3.25
    (tmp_path / standing.PDL_PUBLIC).write_text("\n".join(json.dumps(x) for x in rows))
    after = standing.pdl_public(tmp_path)
    line = next(x for x in after.splitlines() if f"| {r['target']['dtype']} | server |" in x)
    assert " / 3.250 |" in line and line not in before


def test_the_epilogue_table_is_made_from_its_results_file(tmp_path):
    """A row's figures and the count of jobs that passed come from the results file."""
    (tmp_path / "bench" / "results").mkdir(parents=True)
    d = json.loads((ROOT / standing.EPILOGUE_TIMING).read_text())
    r = d["rows"][0]
    r["fused_us"], r["unfused_over_fused"] = 0.5, 9.999
    d["jobs"][0]["status"] = "incorrect"
    (tmp_path / standing.EPILOGUE_TIMING).write_text(json.dumps(d))
    table = standing.epilogue_timing(tmp_path)
    assert f"{len(d['jobs']) - 1} of {len(d['jobs'])} jobs passed" in table
    assert f"| {r['m']}×{r['n']}×{r['k']} | {r['epilogue']} | 0.5 |" in table
    assert table.count("| 9.999 |") == 1


def test_the_build_stage_table_gets_a_newer_run_s_rows_only_with_it(tmp_path):
    """The runs recorded before the third slice have no "record" stage nor measure
    split: a block of those shows neither. A later run that has them gets its column and
    the rows, "–" for the runs without."""
    (tmp_path / "bench" / "results").mkdir(parents=True)
    d = json.loads((ROOT / standing.BUILD_STAGES).read_text())
    d = {k: v for k, v in d.items() if not k.startswith("after") or k in ("after", "after2")}
    (tmp_path / standing.BUILD_STAGES).write_text(json.dumps(d))
    before = standing.build_stages(tmp_path)
    assert "| record |" not in before and "measure: in the worker's jobs" not in before
    newer = json.loads(json.dumps(d["after2"]))
    newer.pop("database", None)  # (its replay seconds need the database: another test)
    newer["stages"]["stages_s"]["record"] = 2.5
    newer["stages"]["measure_split"] = {"jobs": 792, "in_jobs_s": 41.25, "outside_s": 28.621}
    d["after3"] = newer
    (tmp_path / standing.BUILD_STAGES).write_text(json.dumps(d))
    table = standing.build_stages(tmp_path)
    header = next(x for x in table.splitlines() if x.startswith("| stage (busy s)"))
    assert header == "| stage (busy s) | after | after2 | after3 |"
    assert "| record | – | – | 2.5 |" in table
    assert "| measure: in the worker's jobs | – | – | 41.2 |" in table
    assert "| measure: outside them | – | – | 28.6 |" in table
    assert "wait for profile" not in table and "(bg)" not in table


def test_a_run_with_the_profile_in_the_background_says_so(tmp_path):
    """A run made with ``search.profile_lag`` 1 has the "wait for profile" stage and
    "profile" among its background stages: its column gets the row, its profile cell
    "(bg)" and the table a line saying what that means; the runs before, "–" and no mark."""
    (tmp_path / "bench" / "results").mkdir(parents=True)
    d = json.loads((ROOT / standing.BUILD_STAGES).read_text())
    d = {k: v for k, v in d.items() if not k.startswith("after") or k in ("after", "after2")}
    newer = json.loads(json.dumps(d["after2"]))
    newer.pop("database", None)
    newer["stages"]["stages_s"]["wait for profile"] = 1.5
    newer["stages"]["stages_s"]["profile"] = 8.75
    newer["stages"]["overlapped"].append("profile")
    d["after6"] = newer
    (tmp_path / standing.BUILD_STAGES).write_text(json.dumps(d))
    table = standing.build_stages(tmp_path)
    profile = [f"{d[k]['stages']['stages_s']['profile']:.1f}" for k in ("after", "after2")]
    assert f"| profile | {profile[0]} | {profile[1]} | 8.8 (bg) |" in table
    assert "| wait for profile | – | – | 1.5 |" in table
    assert "(bg): in the background (`search.profile_lag = 1`" in table


def test_the_profile_lag_estimate_is_made_from_the_lag_0_run(tmp_path):
    """The rounds are read from the run's database (4, a boundary row each between them);
    ncu's seconds from its stage table: with none, nothing is saved, and the rounds the
    lag leaves unprofiled say so."""
    run = json.loads((ROOT / standing.BUILD_STAGES).read_text())[standing.LAG_RUN]
    spans = standing.round_spans(ROOT / run["database"], standing.LAG_ROUNDS)
    assert len(spans) == 4 and all(
        a <= b < c for (a, b), (c, _) in zip(spans, spans[1:], strict=False)
    )
    table = standing.profile_lag(ROOT)
    assert table.count("| round ") == 3 and table.count("(not profiled)") == 1
    (tmp_path / "bench" / "results").mkdir(parents=True)
    d = json.loads((ROOT / standing.BUILD_STAGES).read_text())
    d[standing.LAG_RUN]["stages"]["stages_s"]["profile"] = 0.0
    (tmp_path / standing.BUILD_STAGES).write_text(json.dumps(d))
    for r in d.values():  # every run's database (a run made with the lag reads its own)
        if isinstance(r, dict) and "database" in r:
            (tmp_path / r["database"]).write_bytes((ROOT / r["database"]).read_bytes())
    none = standing.profile_lag(tmp_path)
    assert "Saved, estimated: 0.0 s" in none and "0.0 s each" in none
    assert "Saved, estimated: 0.0 s" not in table
    # a run made with the lag gets a column of its own gaps (here after5b's records,
    # the run marked as one with its profile in the background)
    lagged = json.loads(json.dumps(d[standing.LAG_RUN]))
    lagged["stages"]["overlapped"].append("profile")
    d["after9"] = lagged
    (tmp_path / standing.BUILD_STAGES).write_text(json.dumps(d))
    with_run = standing.profile_lag(tmp_path)
    assert "| after9, measured |" in with_run  # the last column (after8's is committed)
    gaps = [f"{c[0] - b[1]:.0f}" for b, c in zip(spans, spans[1:], strict=False)]
    rows = [x for x in with_run.splitlines() if x.startswith("| round ")]
    assert [x.rsplit("|", 2)[1].strip() for x in rows] == gaps


def test_the_gated_epilogue_table_is_made_from_its_results_file(tmp_path):
    """Each row's figures (and fused − plain) and the passed-job count come from the file."""
    (tmp_path / "bench" / "results").mkdir(parents=True)
    d = json.loads((ROOT / standing.EPILOGUE_GATED_TIMING).read_text())
    r = d["rows"][0]
    r["fused_us"], r["plain_kernel_us"], r["unfused_over_fused"] = 30.5, 20.25, 9.999
    d["jobs"][0]["status"] = "incorrect"
    (tmp_path / standing.EPILOGUE_GATED_TIMING).write_text(json.dumps(d))
    table = standing.epilogue_gated_timing(tmp_path)
    assert f"{len(d['jobs']) - 1} of {len(d['jobs'])} jobs passed" in table
    row = f"| {r['dtype']} | {r['m']}×{r['n']}×{r['k']} | {r['epilogue']} | 30.5 | 20.2 | +10.2 |"
    assert row in table
    assert table.count("| 9.999 |") == 1
    assert table.count("\n| ") == len(d["rows"]) + 1  # the header and one line a row


BROKEN = [
    # (document, what the error names)
    ("<!-- cudal2:begin where-it-stands -->\nx\n", "without its cudal2:end"),
    ("x\n<!-- cudal2:end where-it-stands -->\n", "without its cudal2:end"),
    ("<!-- cudal2:begin nonsense -->\n<!-- cudal2:end nonsense -->\n", "unknown generated block"),
    (
        "<!-- cudal2:begin llama-e2e -->\n<!-- cudal2:end llama-e2e -->\n" * 2,
        "appears twice",
    ),
]


@pytest.mark.parametrize(("doc", "says"), BROKEN)
def test_broken_markers_exit_2_naming_the_file(tmp_path, capsys, doc, says):
    f = tmp_path / "doc.md"
    f.write_text(doc)
    assert bench_cli.main(["report", str(f), "--root", str(ROOT)]) == 2
    err = capsys.readouterr().err
    assert str(f) in err and says in err and err.count("\n") == 1
    assert f.read_text() == doc


def test_a_root_without_results_is_a_usage_error(tmp_path, capsys):
    assert bench_cli.main(["report", "--root", str(tmp_path)]) == 2
    assert "has no bench/results/" in capsys.readouterr().err


@needs_nvcc
def test_the_shipped_figures_are_what_a_cpu_build_packages(tmp_path, monkeypatch, artifact_cache):
    """The generator's selection (no compile) is the build's: the default manifest
    built for real from its committed database dispatches the counts the README shows."""
    from cudal2.cli import build as build_cli
    from cudal2.packaging.runtime.table import DispatchTable

    monkeypatch.setattr("cudal2.pipeline.build.gpu_names", lambda: [])
    out = tmp_path / "dist"
    assert build_cli.main(["--out", str(out), "--cache", str(artifact_cache.root)]) == 0
    (wheel,) = out.glob("*.whl")
    with zipfile.ZipFile(wheel) as z:
        table = DispatchTable.from_bytes(z.read("cudal2_kernels_default/dispatch.json"))
    s = standing.shipped(ROOT, "default")
    kinds = [e.kind for e in table.entries]
    assert (kinds.count("kernel"), kinds.count("cublaslt"), kinds.count("fallback")) == (
        s.kernel_targets,
        s.cublaslt,
        s.fallback,
    )
    assert len({e.kernel for e in table.entries if e.kind == "kernel"}) == s.kernels


@needs_nvcc
def test_a_target_without_measurements_counts_as_a_fallback(tmp_path):
    """A shape the database never measured gets no selection: the runtime falls back
    for it, and the table says so."""
    (tmp_path / "manifests").mkdir()
    text = (ROOT / "manifests" / "default.toml").read_text()
    (tmp_path / "manifests" / "default.toml").write_text(
        text + "\n[[targets]]\nshapes = [[8, 4096, 4096]]\n"  # never measured
    )
    shutil.copyfile(
        ROOT / "manifests" / "default.measurements.jsonl",
        tmp_path / "manifests" / "default.measurements.jsonl",
    )
    committed, grown = standing.shipped(ROOT, "default"), standing.shipped(tmp_path, "default")
    assert grown.targets == committed.targets + 4  # 2 dtypes x 2 layouts
    assert grown.fallback == committed.fallback + 4
    assert (grown.kernel_targets, grown.cublaslt) == (committed.kernel_targets, committed.cublaslt)


def test_the_paired_prefill_line_is_made_from_its_results_file(tmp_path):
    (tmp_path / "bench" / "results").mkdir(parents=True)
    for name in (standing.E2E_RESULTS, standing.PREFILL_PAIRED):
        d = json.loads((ROOT / name).read_text())
        if name == standing.PREFILL_PAIRED:
            d["cases"][0]["back_to_back"]["paired_speedup"] = 1.2345
        (tmp_path / name).write_text(json.dumps(d))
    table = standing.llama_e2e(tmp_path)
    assert "paired per repetition 1.2345 (p20–p80" in table


def test_the_kv_cache_end_to_end_table_is_made_from_its_results_file(tmp_path):
    """Each decode row's figures and the check's verdict come from the file."""
    (tmp_path / "bench" / "results").mkdir(parents=True)
    d = json.loads((ROOT / standing.KV_E2E).read_text())
    r = d["llama"]["graph"]["batches"]["16"]
    r["tokens_per_s"]["patched"], r["paired_speedup"] = 9999.5, 8.888
    d["llama"]["check"]["correctness"]["ok"] = False
    (tmp_path / standing.KV_E2E).write_text(json.dumps(d))
    table = standing.llama_kv_e2e(tmp_path)
    unpatched = r["tokens_per_s"]["unpatched"]
    assert f"| llama | graph | 16 | {unpatched:.1f} | 9999.5 | 8.888 (" in table
    assert "FAILS" in table
    rows = sum(len(d[m].get(mode, {}).get("batches", {})) for m in d if m != "env"
               for mode in ("graph", "eager"))  # fmt: skip
    assert table.count("\n| ") == rows + 1


def test_the_room_table_is_made_from_its_results_file(tmp_path):
    """A tile's ratio, the geomean and the rejected jobs come from the file."""
    (tmp_path / "bench" / "results").mkdir(parents=True)
    d = json.loads((ROOT / standing.ROOM_TIMING).read_text())
    timed = [r for r in d["rows"] if r.get("pdl_over_room")]
    timed[0]["pdl_over_room"], d["geomean_pdl_over_room"] = 7.777, 1.2345
    d["jobs"][0]["status"], d["jobs"][0]["room"] = "incorrect", "half"
    (tmp_path / standing.ROOM_TIMING).write_text(json.dumps(d))
    table = standing.room_timing(tmp_path)
    assert table.count("| 7.777 |") == 1 and "Geomean PDL / best room: 1.2345" in table
    assert table.count("\n| ") == len(timed) + 1
    bad = [j for j in d["jobs"] if j["status"] != "ok"]
    assert f"Rejected: {sum(j['room'] != 'none' for j in bad)} room" in table


def test_the_fused_host_table_is_made_from_its_results_file(tmp_path):
    """The medians move with the file's figures."""
    (tmp_path / "bench" / "results").mkdir(parents=True)
    d = json.loads((ROOT / standing.FUSED_HOST).read_text())
    for o in d["ops"]:
        o["host_us"]["native"] = 3.25
    d["ops"][0]["host_us"]["python"] = 999.0
    (tmp_path / standing.FUSED_HOST).write_text(json.dumps(d))
    table = standing.fused_host(tmp_path)
    assert "| the package's function, native launcher | 3.2 | 3.2 | 3.2 |" in table
    assert "| 999.0 |" in table  # the Python path's max
    assert f"over {len(d['ops'])} fused entries" in table


def test_the_policy_retrain_table_is_made_from_its_results_files(tmp_path):
    """Each checkpoint-and-corpus row's medians come from its replays' files; a replay not
    run is said so, not left blank."""
    (tmp_path / "bench" / "results").mkdir(parents=True)
    for *_, files in standing.POLICY_RETRAIN:
        for f in filter(None, files):
            shutil.copy(ROOT / f, tmp_path / f)
    i = 2  # the committed checkpoint replayed on the corpus with all the v5 sweeps
    checkpoint, corpus, files = standing.POLICY_RETRAIN[i]
    d = json.loads((ROOT / files[1]).read_text())  # its --online replay
    d["k"]["8"]["policy"], d["k"]["64"]["policy"] = 0.1234, 0.5678
    (tmp_path / files[1]).write_text(json.dumps(d))
    table = standing.policy_retrain(tmp_path)
    rows = [x for x in table.splitlines() if x.startswith("| ") and "---" not in x][1:]
    assert len(rows) == len(standing.POLICY_RETRAIN)
    cells = rows[i].split(" | ")
    assert cells[:2] == [f"| {checkpoint}", corpus]
    assert cells[3].startswith("0.123 / ") and cells[3].endswith(" / 0.568")
    assert "0.123" not in standing.policy_retrain(ROOT)
    assert sum(x.count("not run") for x in rows) == sum(
        f is None for *_, fs in standing.POLICY_RETRAIN for f in fs
    )


def test_the_replay_seconds_follow_each_records_samples(tmp_path):
    """``timing_replay_s`` on records of the committed early-stop build: a job stopped
    after 5 repetitions counts 3 + 5 replays of each graph, a full one 3 + 30, one record
    per job (a profile's second record of the same kernel is not a second job)."""
    import gzip

    from cudal2.hardware import floor_us
    from cudal2.records import Measurement, TimingConfig
    from cudal2.verify.timing import operand_sets, replay_calls

    src = ROOT / "bench/results/h100-llama-build-host4.measurements.jsonl.gz"
    with gzip.open(src, "rt") as f:
        lines = [json.loads(x) for x in f]
    kernels = [r for r in lines if r.get("status") == "ok" and r.get("design")]
    stopped = next(r for r in kernels if len(r["samples_us"]) == 5)
    full = next(r for r in kernels if len(r["samples_us"]) == 30)
    db = tmp_path / "db.jsonl"
    db.write_text("".join(json.dumps(r) + "\n" for r in (stopped, full, full)))
    gpu = "NVIDIA H100 80GB HBM3"
    jobs, total, _ = standing.timing_replay_s(db, gpu)
    cfg = TimingConfig()

    def want(r, reps):
        m = Measurement.from_json(r)
        nsets = operand_sets(m.target.min_bytes)
        calls = replay_calls(nsets, cfg, max(floor_us(m.target, gpu), 2.0))
        pair = m.median_us + m.baselines_us["torch"]
        return ((3 + reps) * calls + min(nsets, 2)) * pair / 1e6

    assert jobs == 2
    assert total == pytest.approx(want(stopped, 5) + want(full, 30))


def test_the_grouped_decode_table_is_made_from_its_results_files(tmp_path):
    """Each run's rows, the grouped twin's check and the attention-alone rows come from
    the files; the README's line reads the same files."""
    results = tmp_path / "bench" / "results"
    results.mkdir(parents=True)
    d = json.loads((ROOT / standing.KV_E2E_GROUPED).read_text())
    r = d["llama"]["grouped"]["batches"]["16"]
    r["paired_speedup_grouped"], r["ms_per_step"]["grouped"] = 7.777, 1.234
    d["llama"]["grouped"]["correctness_grouped"]["ok"] = False
    (tmp_path / standing.KV_E2E_GROUPED).write_text(json.dumps(d))
    for name in (standing.KV_E2E_GROUPED_RULE, standing.KV_E2E_DEFAULT):
        shutil.copy(ROOT / name, tmp_path / name)
    m = json.loads((ROOT / standing.KV_E2E_GROUPED_MATH).read_text())
    m["llama"]["grouped"]["batches"]["4"]["paired_speedup"] = 0.555  # the GEMMs' share
    (tmp_path / standing.KV_E2E_GROUPED_MATH).write_text(json.dumps(m))
    sd = json.loads((ROOT / standing.GROUPED_SDPA).read_text())
    sd["rows"][0]["speedup_grouped"] = 0.123
    (tmp_path / standing.GROUPED_SDPA).write_text(json.dumps(sd))
    table = standing.kv_e2e_grouped(tmp_path)
    assert "| 1.234 | **7.777** (" in table
    assert "(fails)" in table and "| 0.123 |" in table
    rule = json.loads((ROOT / standing.KV_E2E_GROUPED_RULE).read_text())
    rows = sum(len(x["llama"]["grouped"]["batches"]) for x in (d, rule, m))
    assert table.count("\n| `h200-") == rows
    assert table.count("\n| llama-3.1-8b ") + table.count("\n| qwen2-7b ") == len(sd["rows"])
    assert "4: 0.555–" in standing._kv_grouped_line(tmp_path)


def test_the_default_patch_table_and_the_readme_line_read_its_results_file(tmp_path):
    """``kv-e2e-default``: each row, the patch's settings and Qwen2's layer paths come
    from the file; the README's line takes its graph, eager and prefill figures."""
    results = tmp_path / "bench" / "results"
    results.mkdir(parents=True)
    for name in (standing.KV_E2E_GROUPED, standing.KV_E2E_GROUPED_RULE):
        shutil.copy(ROOT / name, tmp_path / name)
    shutil.copy(ROOT / standing.KV_E2E_GROUPED_MATH, tmp_path / standing.KV_E2E_GROUPED_MATH)
    d = json.loads((ROOT / standing.KV_E2E_DEFAULT).read_text())
    d["llama"]["graph"]["batches"]["16"]["paired_speedup"] = 6.543
    d["llama"]["eager"]["batches"]["64"]["paired_speedup"] = 5.432
    d["llama"]["prefill"]["speedup"] = 0.765
    d["env"]["grouped_variant"] = "sdpa"
    d["qwen2"]["report"]["paths"]["1"]["layers"] = {"original": 28}
    (tmp_path / standing.KV_E2E_DEFAULT).write_text(json.dumps(d))
    table = standing.kv_e2e_default(tmp_path)
    assert "| llama | graph | 16 |" in table and "| 6.543 (" in table
    assert 'grouped_decode="sdpa")' in table
    assert "Qwen2-7B's layers at batch 1: original 28 (no kernel entry for gate_up)." in table
    line = standing._kv_grouped_line(tmp_path)
    assert "16: 6.543x" in line and "64: 5.432x" in line and "prefill at 0.765x" in line


def test_the_build_ab_table_has_a_column_per_build_and_the_selections_from_the_databases(
    tmp_path,
):
    """Each call's builds in the order they ran (the call's label and the build's place),
    the shell's wall as targets per GPU-hour, "–" where a build's figure did not come
    back; the selections line is read from the two committed databases."""
    (tmp_path / "bench" / "results").mkdir(parents=True)
    for p in standing.BUILD_AB_DBS:
        shutil.copyfile(ROOT / p, tmp_path / p)
    d = json.loads((ROOT / standing.BUILD_AB).read_text())
    call = d["calls"][0]
    call["runs"] = call["runs"][:2]
    call["runs"][0]["shell_wall_s"] = 72.0
    del call["runs"][0]["stages"]["stages_s"]["compile"]
    d["calls"] = [call]
    (tmp_path / standing.BUILD_AB).write_text(json.dumps(d))
    table = standing.build_ab(tmp_path)
    assert "| | A1 before | A2 after |" in table
    assert "| targets per GPU-hour (shell) | 1200 |" in table  # 24 x 3600 / 72
    assert "| compile | – | 25.2 |" in table
    own, best = standing.best_speedups(tmp_path / standing.BUILD_AB_DBS[1])
    assert 0.9 < own < best and f"{own:.3f} after" in table


def test_the_pair_tile_n_table_has_each_kind_per_target_and_a_dash_for_a_missing_one(tmp_path):
    """The committed H200 sweep: a row per target with each kind's fastest kernel (its
    width), cuBLASLt's; a sweep without the 128x256 pairs shows "–" in that column and
    the pair's gain is still taken over the widths that have both."""
    import gzip

    full = standing.tma_v5_pairn(ROOT)
    rows = [x for x in full.splitlines() if x[:3] in ("| 1", "| 4", "| 8")]
    assert len(rows) == 17 and all(x.count("|") == 7 for x in rows)
    assert "| 1024×7168×8192 | 1.031 (224) | 1.098 (224) |" in full
    src = ROOT / standing.TMA_V5_PAIRN
    with gzip.open(src, "rt") as f:
        lines = [x for x in f if not ('"cluster_m":2' in x and '"wgmma_n":256' in x)]
    dst = tmp_path / standing.TMA_V5_PAIRN
    dst.parent.mkdir(parents=True)
    with gzip.open(dst, "wt") as f:
        f.writelines(lines)
    cut = standing.tma_v5_pairn(tmp_path)
    assert "| 1024×7168×8192 | 1.031 (224) | 1.098 (224) | 0.985 | – |" in cut
    assert "(85 pairs of kernels)" in cut and "(102 pairs of kernels)" in full


def test_the_qwen2_batch_1_check_says_fails_where_it_failed(tmp_path):
    """The committed run passes both logits checks; a run whose batch-1 check failed is
    reported as failing, not passing."""
    assert standing.kv_e2e_qwen2_b1(ROOT).count("passes") == 2
    d = json.loads((ROOT / standing.KV_E2E_QWEN2_B1).read_text())
    d["qwen2"]["correctness_b1"]["ok"] = False
    (tmp_path / "bench" / "results").mkdir(parents=True)
    (tmp_path / standing.KV_E2E_QWEN2_B1).write_text(json.dumps(d))
    text = standing.kv_e2e_qwen2_b1(tmp_path)
    assert "1x128 prompt" in text and text.count("passes") == 1 and "FAILS" in text


def test_the_fused_prefill_e2e_block_reads_its_run(tmp_path):
    """The committed H200 run: its medians, its spreads and the path its layers took at
    the prefill's M come from the file; a changed path changes the sentence."""
    d = json.loads((ROOT / standing.FUSED_PREFILL_E2E).read_text())
    pf = d["llama"]["prefill"]
    text = standing.fused_prefill_e2e(ROOT)
    assert f"unpatched {pf['ms']['unpatched']:.2f} ms" in text
    assert f"speedup {pf['speedup']:.3f}" in text and "The layers at M = 2048: original 32" in text
    d["llama"]["check"]["report"]["paths"]["2048"]["layers"] = {"fused": 30, "original": 2}
    (tmp_path / standing.FUSED_PREFILL_E2E).parent.mkdir(parents=True)
    (tmp_path / standing.FUSED_PREFILL_E2E).write_text(json.dumps(d))
    assert "The layers at M = 2048: fused 30, original 2" in standing.fused_prefill_e2e(tmp_path)


def test_the_prefill_graph_sentence_reads_the_run_or_its_errors(tmp_path):
    """The H100 run captured each prefill whole in a CUDA graph: its replays' medians and
    speedup come from the file, and a run whose capture failed says why instead."""
    path = standing.FUSED_PREFILL_SELECT_E2E
    d = json.loads((ROOT / path).read_text())
    g = d["llama"]["prefill"]["graph"]
    text = standing.fused_prefill_e2e(ROOT, path)
    assert f"patched {g['ms']['patched']:.2f} ms" in text
    assert f"speedup {g['speedup']:.3f}" in text
    assert f"{g['speedup']:.3f}x captured whole in a CUDA graph" in standing._fused_prefill_line(
        ROOT
    )
    d["llama"]["prefill"]["graph"] = {"errors": {"patched": "capture failed: x"}}
    (tmp_path / path).parent.mkdir(parents=True)
    (tmp_path / path).write_text(json.dumps(d))
    text = standing.fused_prefill_e2e(tmp_path, path)
    assert "Under a CUDA graph: not captured (patched: capture failed: x)." in text
    assert "captured whole" not in standing._fused_prefill_line(tmp_path)
    del d["llama"]["prefill"]["graph"]  # a run before the graph part: no sentence
    (tmp_path / path).write_text(json.dumps(d))
    assert "CUDA graph" not in standing.fused_prefill_e2e(tmp_path, path)


def test_the_readme_prefill_line_reads_the_shipped_wheels_benches(tmp_path):
    """The README's M >= 1024 line: the shipped wheel's offline best-vendor geomean per
    dtype over its runs, and the sweeps' winners', recomputed from the files (a changed
    file changes the line); a file without bf16 rows has no bf16 figure to give."""
    from cudal2.bench import llm_public_steps
    from cudal2.bench.report import read_results

    text = llm_public_steps.shipped_line(ROOT)
    assert "1.001–1.004x (fp16) and 1.001–1.005x (bf16) over 2 runs" in text
    assert "1.002x and 0.999x" in text
    _, paths = llm_public_steps.SHIPPED
    for path in paths + llm_public_steps.STEPS[-1][1]:
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        keep = [r for r in read_results(ROOT / path) if r["target"]["dtype"] != "bf16"]
        text = "".join(json.dumps(r) + "\n" for r in keep).encode()
        (tmp_path / path).write_bytes(gzip.compress(text) if path.endswith(".gz") else text)
    with pytest.raises(ValueError, match="no offline bf16 rows at M >= 1024"):
        llm_public_steps.shipped_line(tmp_path)


def test_the_llm_public_steps_block_has_a_row_per_step_and_its_runs():
    from cudal2.bench import llm_public_steps

    rows = [x for x in llm_public_steps.steps(ROOT).splitlines() if x.startswith("| ")][1:]
    assert len(rows) == len(llm_public_steps.STEPS) == 7
    runs = [int(r.split(" | ")[1]) for r in rows]
    assert runs == [1, 1, 3, 2, 4, 2, 1]
    assert rows[0].split(" | ")[2] == "0.988" and rows[3].split(" | ")[2] == "0.997–0.999"
    assert rows[4].split(" | ")[2] == "0.997–1.000" and rows[5].split(" | ")[2] == "1.001–1.004"
