"""Manifest schema: shipped manifests, expansion to targets, and every class of bad input."""

from __future__ import annotations

import hashlib
import shutil
import tomllib
from pathlib import Path
from typing import Any

import pytest

from cudal2.manifest import (
    Manifest,
    ManifestError,
    RunnerSettings,
    SearchSettings,
    default_manifest_path,
    load_manifest,
)
from cudal2.records import Target

REPO = Path(__file__).resolve().parents[2]
MANIFESTS = REPO / "manifests"
SHARED_SHAPES = REPO.parent / "shared" / "shapes"
CONFIGS = Path(__file__).parent / "configs"

TOKENS = [1, 16, 64, 256, 1024, 4096]
LLAMA_8B_NK = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)]
LLAMA_70B_TP8_NK = [(1280, 8192), (8192, 1024), (7168, 8192), (8192, 3584)]

PACKAGE = '[package]\nname = "t"\nversion = "0.1.0"\n'
ONE_TARGET = "[[targets]]\nshapes = [[64, 4096, 4096]]\n"
INF = float("inf")


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "manifest.toml"
    path.write_text(text)
    return path


def _load(tmp_path: Path, text: str) -> Manifest:
    return load_manifest(_write(tmp_path, text))


def _error(tmp_path: Path, text: str) -> ManifestError:
    with pytest.raises(ManifestError) as info:
        _load(tmp_path, text)
    assert "\n" not in str(info.value), "the CLI prints the message as one line"
    return info.value


def _mnk(manifest: Manifest) -> set[tuple[int, int, int]]:
    return {(t.m, t.n, t.k) for t in manifest.targets}


def _model_entry(config: Path | str, **extra: Any) -> str:
    lines = [f"[[model]]\nconfig = '{config}'\ntokens = [1, 64]"]
    lines += [f"{key} = {value}" for key, value in extra.items()]
    return "\n".join(lines) + "\n"


# -- shipped manifests ------------------------------------------------------------------------


def test_default_manifest() -> None:
    path = default_manifest_path()
    assert path.resolve() == (MANIFESTS / "default.toml").resolve()
    m = load_manifest(path)
    assert (m.name, m.version, m.package) == ("default", "0.1.0", "cudal2_kernels_default")
    assert m.archs == ("sm_90a",)
    assert m.dtypes == ("fp16", "bf16")
    assert m.layouts == ("tn", "nn")
    assert m.search == SearchSettings(
        proposer="grid", candidates=10, rounds=1, gpu_budget_s=900.0, seed=0
    )
    assert m.timing_mode == "offline"
    assert len(m.targets) == 8 * 2 * 2
    assert m.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert m.path == path.resolve()
    assert list(m.targets) == sorted(set(m.targets))
    assert Target("sm_90a", "bf16", "nn", 100, 1000, 1000) in m.targets
    assert {(t.dtype, t.layout) for t in m.targets} == {
        ("fp16", "tn"),
        ("fp16", "nn"),
        ("bf16", "tn"),
        ("bf16", "nn"),
    }


def test_llm_public_manifest() -> None:
    m = load_manifest(MANIFESTS / "llm-public-h100.toml")
    assert m.name == "llm_public_h100"
    assert len(m.targets) == 96  # 48 shapes x fp16, bf16
    assert {(t.arch, t.dtype, t.layout, t.accumulator) for t in m.targets} == {
        ("sm_90a", "fp16", "tn", "fp32"),
        ("sm_90a", "bf16", "tn", "fp32"),
    }
    expected = {(mm, n, k) for mm in TOKENS for n, k in LLAMA_8B_NK + LLAMA_70B_TP8_NK}
    assert _mnk(m) == expected


def test_llama_8b_manifest_is_the_8b_half_of_llm_public() -> None:
    m = load_manifest(MANIFESTS / "llama-3.1-8b-h100.toml")
    assert m.name == "llama_3_1_8b_h100"
    assert len(m.targets) == 24
    assert _mnk(m) == {(mm, n, k) for mm in TOKENS for n, k in LLAMA_8B_NK}
    # The same 24 targets as the first (8B) group of the explicit manifest, in fp16.
    public = load_manifest(MANIFESTS / "llm-public-h100.toml")
    assert set(m.targets) == {
        t for t in public.targets if (t.n, t.k) in LLAMA_8B_NK and t.dtype == "fp16"
    }


def test_grid_sample_manifest() -> None:
    m = load_manifest(MANIFESTS / "grid-sample-h100.toml")
    assert m.name == "grid_sample_h100"
    assert len(m.targets) == 24  # 12 shapes x fp16, bf16
    assert (16384, 64, 1024) in _mnk(m)
    assert {(t.dtype, t.layout) for t in m.targets} == {("fp16", "tn"), ("bf16", "tn")}


def test_shipped_copies_match_shared_shape_lists() -> None:
    """The shipped manifests copy ../shared/shapes; compare where that folder exists."""
    llm = SHARED_SHAPES / "llm-public.toml"
    grid = SHARED_SHAPES / "cuda-l2-grid-sample.toml"
    if not (llm.is_file() and grid.is_file()):
        pytest.skip("the shape lists the shipped manifests copy are not in this checkout")
    public = tomllib.loads(llm.read_text())
    by_model = {
        p["model"]: {
            (mm, n, k) for mm in public["tokens"] for n, k in zip(p["n"], p["k"], strict=True)
        }
        for p in public["projection"]
    }
    assert _mnk(load_manifest(MANIFESTS / "llm-public-h100.toml")) == set().union(
        *by_model.values()
    )
    assert _mnk(load_manifest(MANIFESTS / "llama-3.1-8b-h100.toml")) == by_model["llama-3.1-8b"]
    sample = {tuple(s) for s in tomllib.loads(grid.read_text())["shapes"]}
    assert _mnk(load_manifest(MANIFESTS / "grid-sample-h100.toml")) == sample


# -- expansion ----------------------------------------------------------------------------------


def test_defaults(tmp_path: Path) -> None:
    m = _load(tmp_path, PACKAGE + ONE_TARGET)
    assert m.archs == ("sm_90a",)
    assert m.dtypes == ("fp16",)
    assert m.layouts == ("tn",)
    assert m.search == SearchSettings("policy", 8, 1, 1800.0, 0)
    assert m.search.cublaslt  # cuBLASLt is autotuned unless a manifest says not
    assert not _load(
        tmp_path, PACKAGE + "[search]\ncublaslt = false\n" + ONE_TARGET
    ).search.cublaslt
    assert m.timing_mode == "offline"
    assert m.targets == (Target("sm_90a", "fp16", "tn", 64, 4096, 4096),)
    assert m.package == "cudal2_kernels_t"
    # Nsight Compute: the search's quantities, the last round not profiled, unless asked
    assert (m.search.profile_metrics, m.search.profile_last_round) == ("search", False)
    asked = _load(
        tmp_path,
        PACKAGE + '[search]\nprofile_metrics = "all"\nprofile_last_round = true\n' + ONE_TARGET,
    ).search
    assert (asked.profile_metrics, asked.profile_last_round) == ("all", True)


def test_all_sections(tmp_path: Path) -> None:
    m = _load(
        tmp_path,
        PACKAGE
        + """
[build]
gpus = ["sm_90a"]
dtypes = ["bf16", "fp16", "bf16"]
layouts = ["nn"]
[search]
proposer = "policy"
candidates = 3
rounds = 2
gpu_budget_s = 12.5
seed = 7
[timing]
mode = "server"
"""
        + ONE_TARGET,
    )
    assert m.dtypes == ("bf16", "fp16")  # repeats count once, order kept
    assert m.search == SearchSettings("policy", 3, 2, 12.5, 7)
    assert m.timing_mode == "server"
    assert len(m.targets) == 2
    assert {t.layout for t in m.targets} == {"nn"}


def test_group_overrides_and_dedup(tmp_path: Path) -> None:
    m = _load(
        tmp_path,
        PACKAGE
        + """
[build]
dtypes = ["fp16"]
layouts = ["tn"]
[[targets]]
shapes = [[64, 4096, 4096], [64, 4096, 4096]]
[[targets]]
shapes = [[1, 8, 8]]
dtypes = ["bf16"]
layouts = ["tn", "nn"]
[[grid]]
m = [64, 128]
n = [4096]
k = [4096, 8192]
""",
    )
    assert set(m.targets) == {
        Target("sm_90a", "fp16", "tn", 64, 4096, 4096),
        Target("sm_90a", "bf16", "tn", 1, 8, 8),
        Target("sm_90a", "bf16", "nn", 1, 8, 8),
        Target("sm_90a", "fp16", "tn", 64, 4096, 8192),
        Target("sm_90a", "fp16", "tn", 128, 4096, 4096),
        Target("sm_90a", "fp16", "tn", 128, 4096, 8192),
    }
    assert list(m.targets) == sorted(m.targets)


def test_model_config_relative_to_manifest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shutil.copytree(CONFIGS / "mistral-7b", tmp_path / "configs" / "mistral")
    path = _write(tmp_path, PACKAGE + _model_entry("configs/mistral/config.json"))
    monkeypatch.chdir(REPO)  # resolution must not depend on the working directory
    m = load_manifest(path)
    assert _mnk(m) == {
        (mm, n, k)
        for mm in (1, 64)
        for n, k in [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)]
    }


def test_model_directory_tp_and_unfused(tmp_path: Path) -> None:
    m = _load(
        tmp_path,
        PACKAGE + _model_entry(CONFIGS / "llama-3.1-70b", tp=8, fused="false", dtypes='["bf16"]'),
    )
    # Unfused, tp 8: q (1024, 8192), k = v (128, 8192), o (8192, 1024),
    # gate = up (3584, 8192), down (8192, 3584); k/v and gate/up coincide.
    assert _mnk(m) == {
        (mm, n, k)
        for mm in (1, 64)
        for n, k in [(1024, 8192), (128, 8192), (8192, 1024), (3584, 8192), (8192, 3584)]
    }
    assert {t.dtype for t in m.targets} == {"bf16"}


# -- bad input --------------------------------------------------------------------------------


def test_toml_syntax_error_has_file_line_and_column(tmp_path: Path) -> None:
    e = _error(tmp_path, PACKAGE + "[search]\ncandidates 8\n")
    msg = str(e)
    assert str((tmp_path / "manifest.toml").resolve()) in msg
    assert "line 5" in msg
    assert "column" in msg
    assert e.value == "candidates 8"
    assert "'candidates 8'" in msg


def test_duplicate_key_is_a_syntax_error(tmp_path: Path) -> None:
    e = _error(tmp_path, PACKAGE + "[search]\nseed = 1\nseed = 2\n" + ONE_TARGET)
    assert "line 6" in str(e)


# (manifest body after [package], key path, offending value)
BAD: list[tuple[str, str, Any]] = [
    # unknown keys, at every level
    ("[search]\ncandidate = 8\n" + ONE_TARGET, "search.candidate", 8),
    ("[build]\ngpu = ['sm_90a']\n" + ONE_TARGET, "build.gpu", ["sm_90a"]),
    ("[timing]\nmodes = 'offline'\n" + ONE_TARGET, "timing.modes", "offline"),
    (ONE_TARGET + "[[targets]]\nshape = [[1, 2, 3]]\n", "targets[1].shape", [[1, 2, 3]]),
    ("[[grid]]\nm = [1]\nn = [1]\nk = [1]\nl = [1]\n", "grid[0].l", [1]),
    ("[[model]]\nconfig = 'x'\ntoken = [1]\n", "model[0].token", [1]),
    # wrong types
    ("[search]\ncandidates = true\n" + ONE_TARGET, "search.candidates", True),
    ("[search]\ncandidates = 8.0\n" + ONE_TARGET, "search.candidates", 8.0),
    ("[search]\ncandidates = '8'\n" + ONE_TARGET, "search.candidates", "8"),
    ("[search]\nrounds = 0\n" + ONE_TARGET, "search.rounds", 0),
    ("[search]\nseed = -1\n" + ONE_TARGET, "search.seed", -1),
    ("[search]\nprofile_top = -1\n" + ONE_TARGET, "search.profile_top", -1),
    ("[search]\nprofile_metrics = 'few'\n" + ONE_TARGET, "search.profile_metrics", "few"),
    ("[search]\nprofile_last_round = 0\n" + ONE_TARGET, "search.profile_last_round", 0),
    ("[search]\nfamilies = ['sm100x']\n" + ONE_TARGET, "search.families[0]", "sm100x"),
    ("[search]\nfamilies = []\n" + ONE_TARGET, "search.families", []),
    # [search] knobs: names of some family's knobs, lists of values in their domains
    ("[search]\nknobs = { rastr = [8] }\n" + ONE_TARGET, "search.knobs.rastr", [8]),
    ("[search]\nknobs = { store = [6] }\n" + ONE_TARGET, "search.knobs.store", [6]),
    ("[search]\nknobs = { store = [] }\n" + ONE_TARGET, "search.knobs.store", []),
    ("[search]\nknobs = { store = 1 }\n" + ONE_TARGET, "search.knobs.store", 1),
    ("[search]\nknobs = { store = [true] }\n" + ONE_TARGET, "search.knobs.store", True),
    ("[search]\nknobs = { store = ['1'] }\n" + ONE_TARGET, "search.knobs.store", "1"),
    ("[search]\nknobs = { raster = [-8] }\n" + ONE_TARGET, "search.knobs.raster", -8),
    ("[search]\nknobs = {}\n" + ONE_TARGET, "search.knobs", {}),
    ("[search]\nknobs = [1]\n" + ONE_TARGET, "search.knobs", [1]),
    ("[search]\ncublaslt = 'yes'\n" + ONE_TARGET, "search.cublaslt", "yes"),
    ("[search]\ngpu_budget_s = 0\n" + ONE_TARGET, "search.gpu_budget_s", 0),
    ("[search]\ngpu_budget_s = true\n" + ONE_TARGET, "search.gpu_budget_s", True),
    ("[search]\ngpu_budget_s = inf\n" + ONE_TARGET, "search.gpu_budget_s", float("inf")),
    ("[targets]\nshapes = [[1, 2, 3]]\n", "targets", {"shapes": [[1, 2, 3]]}),
    ("[build]\ndtypes = 'fp16'\n" + ONE_TARGET, "build.dtypes", "fp16"),
    ("[build]\ndtypes = []\n" + ONE_TARGET, "build.dtypes", []),
    ("[build]\neager_host_saving_us = -1.0\n" + ONE_TARGET, "build.eager_host_saving_us", -1.0),
    ("[build]\neager_host_saving_us = inf\n" + ONE_TARGET, "build.eager_host_saving_us", INF),
    ("[build]\neager_host_saving_us = 1e9\n" + ONE_TARGET, "build.eager_host_saving_us", 1e9),
    ("[build]\neager_host_saving_us = true\n" + ONE_TARGET, "build.eager_host_saving_us", True),
    ("[build]\neager_host_saving_us = '4.3'\n" + ONE_TARGET, "build.eager_host_saving_us", "4.3"),
    ("[build]\neager_host_saving_us = [4.3]\n" + ONE_TARGET, "build.eager_host_saving_us", [4.3]),
    # reused databases: paths beside the manifest (tmp_path holds manifest.toml only)
    ("[build]\nreuse = 'a.jsonl'\n" + ONE_TARGET, "build.reuse", "a.jsonl"),
    ("[build]\nreuse = []\n" + ONE_TARGET, "build.reuse", []),
    ("[build]\nreuse = [1]\n" + ONE_TARGET, "build.reuse[0]", 1),
    ("[build]\nreuse = [' ']\n" + ONE_TARGET, "build.reuse[0]", " "),
    (
        "[build]\nreuse = ['manifest.toml', 'gone.jsonl']\n" + ONE_TARGET,
        "build.reuse[1]",
        "gone.jsonl",
    ),
    ("[build]\nreuse = ['.']\n" + ONE_TARGET, "build.reuse[0]", "."),
    (
        "[build]\nreuse = ['manifest.toml', './manifest.toml']\n" + ONE_TARGET,
        "build.reuse[1]",
        "./manifest.toml",
    ),
    # dimensions and shapes
    ("[[targets]]\nshapes = [[1, 2, 3], [4, 5, 6], [7, 0, 9]]\n", "targets[0].shapes[2][1]", 0),
    ("[[targets]]\nshapes = [[1, 2, 3], [4, 5, 6], [7, -8, 9]]\n", "targets[0].shapes[2][1]", -8),
    ("[[targets]]\nshapes = [[1, 2, 3], [4, 5, 6], [7, 8.5, 9]]\n", "targets[0].shapes[2][1]", 8.5),
    ("[[targets]]\nshapes = [[1, 2, 3], [4, 5, 6], [7, '8', 9]]\n", "targets[0].shapes[2][1]", "8"),
    ("[[targets]]\nshapes = [[1, true, 3]]\n", "targets[0].shapes[0][1]", True),
    ("[[targets]]\nshapes = [[1, 2, 2147483648]]\n", "targets[0].shapes[0][2]", 2147483648),
    ("[[targets]]\nshapes = [[1, 2, 3], [64, 4096]]\n", "targets[0].shapes[1]", [64, 4096]),
    ("[[targets]]\nshapes = [64, 4096, 4096]\n", "targets[0].shapes[0]", 64),
    ("[[targets]]\nshapes = []\n", "targets[0].shapes", []),
    ("[[targets]]\ndtypes = ['fp16']\n", "targets[0].shapes", None),
    ("[[grid]]\nm = [1]\nn = [1]\nk = [4, 0]\n", "grid[0].k[1]", 0),
    ("[[grid]]\nm = [1]\nk = [4]\n", "grid[0].n", None),
    ("[[grid]]\nm = 64\nn = [1]\nk = [4]\n", "grid[0].m", 64),
    # unsupported values (the message lists the supported ones, checked below)
    ("[build]\ngpus = ['sm_80']\n" + ONE_TARGET, "build.gpus[0]", "sm_80"),
    ("[build]\ndtypes = ['fp16', 'fp8']\n" + ONE_TARGET, "build.dtypes[1]", "fp8"),
    ("[[targets]]\nshapes = [[1, 2, 3]]\nlayouts = ['tt']\n", "targets[0].layouts[0]", "tt"),
    ("[search]\nproposer = 'bayes'\n" + ONE_TARGET, "search.proposer", "bayes"),
    ("[timing]\nmode = 'cloud'\n" + ONE_TARGET, "timing.mode", "cloud"),
    # model entries that need no config file
    ("[[model]]\ntokens = [1]\n", "model[0].config", None),
    ("[[model]]\nconfig = 3\ntokens = [1]\n", "model[0].config", 3),
    ("[[model]]\nconfig = 'c'\ntokens = [0]\n", "model[0].tokens[0]", 0),
    ("[[model]]\nconfig = 'c'\ntokens = [1]\ntp = 0\n", "model[0].tp", 0),
    ("[[model]]\nconfig = 'c'\ntokens = [1]\nfused = 'yes'\n", "model[0].fused", "yes"),
    # [runner]
    ("[runner]\nkind = 'slurm'\n" + ONE_TARGET, "runner.kind", "slurm"),
    ("[runner]\nkind = 1\n" + ONE_TARGET, "runner.kind", 1),
    ("[runner]\nkinds = 'host'\n" + ONE_TARGET, "runner.kinds", "host"),
    ("[[runner]]\nkind = 'host'\n" + ONE_TARGET, "runner", [{"kind": "host"}]),
    ("[runner]\nkind = 'host'\ndevices = []\n" + ONE_TARGET, "runner.devices", []),
    ("[runner]\nkind = 'host'\ndevices = 0\n" + ONE_TARGET, "runner.devices", 0),
    ("[runner]\nkind = 'host'\ndevices = [0, -1]\n" + ONE_TARGET, "runner.devices[1]", -1),
    ("[runner]\nkind = 'host'\ndevices = [0, 1.0]\n" + ONE_TARGET, "runner.devices[1]", 1.0),
    ("[runner]\nkind = 'host'\ndevices = [true]\n" + ONE_TARGET, "runner.devices[0]", True),
    ("[runner]\nkind = 'host'\ndevices = ['0']\n" + ONE_TARGET, "runner.devices[0]", "0"),
    ("[runner]\nkind = 'host'\ndevices = [256]\n" + ONE_TARGET, "runner.devices[0]", 256),
    ("[runner]\nkind = 'host'\ndevices = [0, 1, 0]\n" + ONE_TARGET, "runner.devices[2]", 0),
    ("[runner]\ndevices = [0]\n" + ONE_TARGET, "runner.devices", [0]),
    ("[runner]\nkind = 'ray'\ndevices = [0]\n" + ONE_TARGET, "runner.devices", [0]),
    (
        "[runner]\ninterchangeable = [['A', 'B']]\n" + ONE_TARGET,
        "runner.interchangeable",
        [["A", "B"]],
    ),
    ("[runner]\nkind = 'host'\ninterchangeable = []\n" + ONE_TARGET, "runner.interchangeable", []),
    (
        "[runner]\nkind = 'host'\ninterchangeable = ['A', 'B']\n" + ONE_TARGET,
        "runner.interchangeable[0]",
        "A",
    ),
    (
        "[runner]\nkind = 'host'\ninterchangeable = [['A']]\n" + ONE_TARGET,
        "runner.interchangeable[0]",
        ["A"],
    ),
    (
        "[runner]\nkind = 'ray'\ninterchangeable = [['A', 3]]\n" + ONE_TARGET,
        "runner.interchangeable[0][1]",
        3,
    ),
    (
        "[runner]\nkind = 'ray'\ninterchangeable = [['A', ' ']]\n" + ONE_TARGET,
        "runner.interchangeable[0][1]",
        " ",
    ),
    ("[runner]\nkind = 'host'\nray_address = 'auto'\n" + ONE_TARGET, "runner.ray_address", "auto"),
    ("[runner]\nray_address = 'auto'\n" + ONE_TARGET, "runner.ray_address", "auto"),
    ("[runner]\nkind = 'ray'\nray_address = ''\n" + ONE_TARGET, "runner.ray_address", ""),
    ("[runner]\nkind = 'ray'\nray_address = 6379\n" + ONE_TARGET, "runner.ray_address", 6379),
    ("[runner]\njob_timeout_s = 0\n" + ONE_TARGET, "runner.job_timeout_s", 0),
    ("[runner]\njob_timeout_s = -5.0\n" + ONE_TARGET, "runner.job_timeout_s", -5.0),
    ("[runner]\njob_timeout_s = inf\n" + ONE_TARGET, "runner.job_timeout_s", INF),
    ("[runner]\njob_timeout_s = '60'\n" + ONE_TARGET, "runner.job_timeout_s", "60"),
    ("[runner]\njob_timeout_s = true\n" + ONE_TARGET, "runner.job_timeout_s", True),
    # no targets at all
    ("[search]\nseed = 1\n", "targets", None),
]


@pytest.mark.parametrize(("body", "key_path", "value"), BAD)
def test_bad_input_names_key_path_and_value(
    tmp_path: Path, body: str, key_path: str, value: Any
) -> None:
    e = _error(tmp_path, PACKAGE + body)
    assert e.key_path == key_path
    assert e.value == value
    assert type(e.value) is type(value)  # True must not come back as 1, 8.0 as 8
    msg = str(e)
    assert key_path in msg
    assert str((tmp_path / "manifest.toml").resolve()) in msg
    if value is not None:
        assert repr(value) in msg


def test_reuse_paths_are_beside_the_manifest(tmp_path: Path) -> None:
    """``[build] reuse`` names databases relative to the manifest's folder (or absolute),
    in the manifest's order, whatever the working directory."""
    (tmp_path / "sweeps").mkdir()
    (tmp_path / "sweeps" / "a.jsonl.gz").write_bytes(b"")
    b = tmp_path.parent / f"{tmp_path.name}-b.jsonl"
    b.write_bytes(b"")
    m = _load(tmp_path, PACKAGE + f"[build]\nreuse = ['sweeps/a.jsonl.gz', '{b}']\n" + ONE_TARGET)
    assert m.reuse == (tmp_path.resolve() / "sweeps" / "a.jsonl.gz", b)
    assert _load(tmp_path, PACKAGE + ONE_TARGET).reuse == ()


RUNNERS = [
    # [runner] body, the settings it makes
    ("", RunnerSettings()),
    ("[runner]\n", RunnerSettings()),
    ("[runner]\nkind = 'local'\njob_timeout_s = 60\n", RunnerSettings(job_timeout_s=60.0)),
    ("[runner]\nkind = 'host'\n", RunnerSettings(kind="host")),
    (
        "[runner]\nkind = 'host'\ndevices = [2, 0]\ninterchangeable = "
        "[['NVIDIA H100 80GB HBM3', 'NVIDIA H200', 'NVIDIA H200']]\n",
        RunnerSettings(
            kind="host",
            devices=(2, 0),
            interchangeable=(("NVIDIA H100 80GB HBM3", "NVIDIA H200"),),
        ),
    ),
    ("[runner]\nkind = 'ray'\n", RunnerSettings(kind="ray")),
    (
        "[runner]\nkind = 'ray'\nray_address = 'ray://head:10001'\njob_timeout_s = 30.5\n",
        RunnerSettings(kind="ray", ray_address="ray://head:10001", job_timeout_s=30.5),
    ),
]


@pytest.mark.parametrize(("body", "settings"), RUNNERS)
def test_runner_settings(tmp_path: Path, body: str, settings: RunnerSettings) -> None:
    assert _load(tmp_path, PACKAGE + body + ONE_TARGET).runner == settings


def test_unsupported_runner_kind_lists_supported(tmp_path: Path) -> None:
    e = _error(tmp_path, PACKAGE + "[runner]\nkind = 'slurm'\n" + ONE_TARGET)
    assert "local, host, ray" in str(e)
    e = _error(tmp_path, PACKAGE + "[runner]\ndevices = [0]\n" + ONE_TARGET)
    assert "only with kind = 'host'" in str(e) and "'local'" in str(e)


@pytest.mark.parametrize(
    ("body", "supported"),
    [
        ("[build]\ngpus = ['sm_80']\n", "sm_90a"),
        ("[build]\ndtypes = ['fp8']\n", "fp16, bf16"),
        ("[build]\nlayouts = ['tt']\n", "tn, nn"),
        ("[search]\nproposer = 'bayes'\n", "grid, random, sample, policy"),
        ("[timing]\nmode = 'cloud'\n", "offline, server"),
    ],
)
def test_unsupported_value_lists_supported(tmp_path: Path, body: str, supported: str) -> None:
    assert supported in str(_error(tmp_path, PACKAGE + body + ONE_TARGET))


@pytest.mark.parametrize(
    ("top", "key_path", "value"),
    [("colour = 'red'\n", "colour", "red"), ("search = 3\n", "search", 3)],
)
def test_bad_top_level_key(tmp_path: Path, top: str, key_path: str, value: Any) -> None:
    # Top-level keys must come before the first table, or TOML files them under it.
    e = _error(tmp_path, top + PACKAGE + ONE_TARGET)
    assert (e.key_path, e.value) == (key_path, value)
    assert f"{key_path} = {value!r}" in str(e)


def test_unknown_key_lists_allowed(tmp_path: Path) -> None:
    msg = str(_error(tmp_path, PACKAGE + "[search]\ncandidate = 8\n" + ONE_TARGET))
    assert "candidates" in msg and "gpu_budget_s" in msg


@pytest.mark.parametrize(
    ("text", "key_path", "value"),
    [
        (ONE_TARGET, "package", None),
        ('[package]\nversion = "0.1.0"\n' + ONE_TARGET, "package.name", None),
        ('[package]\nname = "t"\n' + ONE_TARGET, "package.version", None),
        (
            '[package]\nname = "My-Team"\nversion = "0.1.0"\n' + ONE_TARGET,
            "package.name",
            "My-Team",
        ),
        ('[package]\nname = "t"\nversion = "one"\n' + ONE_TARGET, "package.version", "one"),
        ('[package]\nname = "t"\nversion = 1\n' + ONE_TARGET, "package.version", 1),
        ('package = "t"\n' + ONE_TARGET, "package", "t"),
    ],
)
def test_bad_package(tmp_path: Path, text: str, key_path: str, value: Any) -> None:
    e = _error(tmp_path, text)
    assert (e.key_path, e.value) == (key_path, value)
    assert key_path in str(e)


@pytest.mark.parametrize("version", ["0.1.0", "1", "2.0rc1", "1.0a2", "0.3.post1", "1.0.dev4"])
def test_good_versions(tmp_path: Path, version: str) -> None:
    text = f'[package]\nname = "t"\nversion = "{version}"\n' + ONE_TARGET
    assert _load(tmp_path, text).version == version


@pytest.mark.parametrize(
    ("written", "normalised"),
    [("1.0a", "1.0a0"), ("v1", "1"), ("1.0-post1", "1.0.post1"), ("1.0RC1", "1.0rc1")],
)
def test_versions_are_normalised_as_the_wheel_is_named(
    tmp_path: Path, written: str, normalised: str
) -> None:
    """PEP 440 spellings the PyPA parser accepts are kept in their normalised form, the
    one the wheel writer names the wheel with (its own rule: ``wheel_version``)."""
    text = f'[package]\nname = "t"\nversion = "{written}"\n' + ONE_TARGET
    assert _load(tmp_path, text).version == normalised


def test_missing_model_config_names_resolved_path(tmp_path: Path) -> None:
    e = _error(tmp_path, PACKAGE + _model_entry("configs/none/config.json"))
    resolved = str((tmp_path / "configs" / "none" / "config.json").resolve())
    assert e.key_path == "model[0].config"
    assert e.value == resolved
    assert resolved in str(e)
    assert "not found" in str(e)


def test_unsupported_model_architecture(tmp_path: Path) -> None:
    e = _error(tmp_path, PACKAGE + _model_entry(CONFIGS / "gpt2" / "config.json"))
    assert e.key_path == "model[0].config"
    assert e.value == str(CONFIGS / "gpt2" / "config.json")
    assert "'gpt2'" in str(e)
    assert "llama, mistral, qwen2, gemma, gemma2, phi3" in str(e)


def test_model_tp_not_dividing(tmp_path: Path) -> None:
    e = _error(tmp_path, PACKAGE + _model_entry(CONFIGS / "qwen2-0.5b", tp=4))
    assert (e.key_path, e.value) == ("model[0].tp", 4)
    assert "num_attention_heads=14" in str(e)


def test_missing_manifest_file(tmp_path: Path) -> None:
    with pytest.raises(ManifestError, match="cannot read manifest") as info:
        load_manifest(tmp_path / "absent.toml")
    assert info.value.value == str((tmp_path / "absent.toml").resolve())


def test_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "manifest.toml"
    path.write_bytes(b"\xff\xfe" + PACKAGE.encode())
    with pytest.raises(ManifestError, match="not UTF-8"):
        load_manifest(path)


def test_lm_head_true_adds_the_lm_head_the_shipped_manifest_lists_by_hand(tmp_path: Path) -> None:
    """``lm_head = true`` gives what llama-3.1-8b-hf-h100.toml spells out as a
    [[targets]] group beside its [[model]] (vocab 128256 x hidden 4096)."""
    shipped = load_manifest(MANIFESTS / "llama-3.1-8b-hf-h100.toml")
    text = (MANIFESTS / "llama-3.1-8b-hf-h100.toml").read_text()
    model_only = text[: text.index("[[targets]]")].replace(
        "configs/", str(MANIFESTS / "configs") + "/"
    )
    assert _mnk(_load(tmp_path, model_only)) < _mnk(shipped)
    with_head = model_only.replace("fused = false", "fused = false\nlm_head = true")
    assert with_head != model_only
    assert _load(tmp_path, with_head).targets == shipped.targets
    off = model_only.replace("fused = false", "fused = false\nlm_head = false")
    assert _mnk(_load(tmp_path, off)) == _mnk(_load(tmp_path, model_only))
