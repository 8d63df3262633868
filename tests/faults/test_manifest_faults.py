"""Hostile manifests through ``cudal2-build`` (issue 17): every one exits 2 with one line
naming the key path and the value at fault, and writes nothing (no wheel folder, no
measurement database, no artifact cache).

Each case is one line of ``CASES``: an id, the manifest (its text, or a function that
makes a hostile file and returns its path), the key path and value the message must
quote, and a fragment of what it says is wrong. Model configs a case needs are written
beside the manifest (``cfg/config.json``), from a real config (TinyLlama-1.1B) with one
value broken.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from cudal2.cli import build as build_cli
from cudal2.manifest import MAX_MANIFEST_BYTES, MAX_TARGETS, shown

CONFIG = Path(__file__).parents[1] / "cudal2" / "configs" / "tinyllama-1.1b" / "config.json"

PKG = '[package]\nname = "t"\nversion = "0.1.0"\n'
ONE = "[[targets]]\nshapes = [[64, 4096, 4096]]\n"
OK = PKG + ONE
MODEL = "[[model]]\nconfig = 'cfg/config.json'\ntokens = [1, 64]\n"
NONE = object()  # the message quotes no value (a missing key, the file as a whole)


def pkg(name: str = '"t"', version: str = '"0.1.0"') -> str:
    return f"[package]\nname = {name}\nversion = {version}\n" + ONE


def grid(m: int, n: int, k: int, extra: str = "") -> str:
    axes = {a: list(range(1, c + 1)) for a, c in (("m", m), ("n", n), ("k", k))}
    return "[[grid]]\n" + "".join(f"{a} = {v}\n" for a, v in axes.items()) + extra


def config(**changes: Any) -> dict[str, bytes]:
    """``cfg/config.json``: TinyLlama's, with ``changes`` (None deletes a key)."""
    raw = json.loads(CONFIG.read_text())
    for key, value in changes.items():
        if value is None:
            raw.pop(key, None)
        else:
            raw[key] = value
    return {"cfg/config.json": json.dumps(raw).encode()}


# -- hostile files (a function of the test's folder that returns the manifest path) --------


def _missing(tmp: Path) -> Path:
    return tmp / "none.toml"


def _folder(tmp: Path) -> Path:
    (tmp / "m.toml").mkdir()
    return tmp / "m.toml"


def _fifo(tmp: Path) -> Path:
    os.mkfifo(tmp / "m.toml")
    return tmp / "m.toml"


def _loop(tmp: Path) -> Path:
    (tmp / "a.toml").symlink_to(tmp / "b.toml")
    (tmp / "b.toml").symlink_to(tmp / "a.toml")
    return tmp / "a.toml"


def _huge(tmp: Path) -> Path:
    path = tmp / "m.toml"
    with path.open("wb") as f:  # a sparse file: its size, without writing it
        f.write(OK.encode())
        f.truncate(MAX_MANIFEST_BYTES + 1)
    return path


def _huge_config(tmp: Path) -> Path:
    (tmp / "cfg").mkdir()
    with (tmp / "cfg" / "config.json").open("wb") as f:
        f.truncate((16 << 20) + 1)
    (tmp / "m.toml").write_text(PKG + MODEL)
    return tmp / "m.toml"


def _config_folder(tmp: Path) -> Path:
    (tmp / "cfg" / "config.json").mkdir(parents=True)
    (tmp / "m.toml").write_text(PKG + MODEL)
    return tmp / "m.toml"


class Case(NamedTuple):
    id: str
    manifest: str | bytes | Callable[[Path], Path]
    key: str  # the key path the message names ("" for the file as a whole)
    value: Any  # the value it quotes, or NONE
    says: str  # what it says is wrong
    files: dict[str, bytes] | None = None  # written beside the manifest first


# fmt: off
CASES: list[Case] = [
    # the file: syntax, encoding, size, what it is
    Case("toml-syntax", "[package\n", "", "[package", "TOML syntax error"),
    Case("toml-duplicate-key", PKG + 'name = "u"\n' + ONE, "", 'name = "u"', "TOML syntax error"),
    Case("toml-duplicate-table", PKG + PKG + ONE, "", "[package]", "TOML syntax error"),
    Case("toml-bad-escape", '[package]\nname = "\\q"\n', "", 'name = "\\q"', "TOML syntax error"),
    Case("toml-nul-byte", PKG + "x = 1\0\n" + ONE, "", NONE, "TOML syntax error"),
    Case("toml-utf8-bom", b"\xef\xbb\xbf" + OK.encode(), "", NONE, "'\\ufeff[package]'"),
    Case("not-utf8", b"[package]\nname = \"\xff\"\n", "", NONE, "not UTF-8 text"),
    Case("utf16", OK.encode("utf-16"), "", NONE, "not UTF-8 text"),
    Case("nested-5000-deep", "x = " + "[" * 5000 + "]" * 5000, "", NONE, "nested too deeply"),
    Case("dotted-key-5000-deep", "x." * 5000 + "y = 1\n" + OK, "x", NONE, "unknown key"),
    Case("integer-5000-digits", "x = " + "9" * 5000 + "\n", "", NONE, "4300"),
    Case("empty-file", "", "package", NONE, "missing required table [package]"),
    Case("larger-than-1MiB", _huge, "", NONE, "more than a manifest may have"),
    Case("missing-file", _missing, "", NONE, "No such file or directory"),
    Case("a-folder", _folder, "", NONE, "not a regular file"),
    Case("a-fifo", _fifo, "", NONE, "not a regular file"),
    Case("dev-zero", lambda tmp: Path("/dev/zero"), "", NONE, "not a regular file"),
    Case("symlink-loop", _loop, "", NONE, "Symlink loop"),
    Case("unknown-top-key", "extra = 1\n" + OK, "extra", 1, "unknown key; allowed in the top"),
    Case("capitalised-table", OK + "[Package]\n", "Package", {}, "unknown key"),
    # [package]: names and versions (the wheel writer's own rule)
    Case("no-package", ONE, "package", NONE, "missing required table [package]"),
    Case("package-not-table", 'package = "t"\n' + ONE, "package", "t", "must be a table"),
    Case("no-name", '[package]\nversion = "0.1.0"\n' + ONE, "package.name", NONE, "missing"),
    Case("no-version", '[package]\nname = "t"\n' + ONE, "package.version", NONE, "missing"),
    Case("name-int", pkg(name="1"), "package.name", 1, "must be a string"),
    Case("name-empty", pkg(name='""'), "package.name", "", "1 to 64 characters"),
    Case("name-300-chars", pkg(name=f'"{"a" * 300}"'), "package.name", "a" * 300, "got 300"),
    Case("name-65-chars", pkg(name=f'"{"a" * 65}"'), "package.name", "a" * 65, "got 65"),
    Case("name-trailing-newline", pkg(name='"t\\n"'), "package.name", "t\n", "must match"),
    Case("name-dash", pkg(name='"My-Team"'), "package.name", "My-Team", "must match"),
    Case("name-upper", pkg(name='"T"'), "package.name", "T", "must match"),
    Case("name-dot", pkg(name='"t.1"'), "package.name", "t.1", "must match"),
    Case("name-digit-first", pkg(name='"1t"'), "package.name", "1t", "must match"),
    Case("name-underscore-first", pkg(name='"_t"'), "package.name", "_t", "must match"),
    Case("name-underscore-last", pkg(name='"t_"'), "package.name", "t_", "must match"),
    Case("name-double-underscore", pkg(name='"a__b"'), "package.name", "a__b", "must match"),
    Case("name-non-ascii", pkg(name='"tëst"'), "package.name", "tëst", "must match"),
    Case("name-arabic-digit", pkg(name='"t\u0663"'), "package.name", "t\u0663", "must match"),
    Case("name-space", pkg(name='"my team"'), "package.name", "my team", "must match"),
    Case("version-int", pkg(version="1"), "package.version", 1, "must be a string"),
    Case("version-float", pkg(version="1.0"), "package.version", 1.0, "must be a string"),
    Case("version-empty", pkg(version='""'), "package.version", "", "1 to 64 characters"),
    Case("version-trailing-newline", pkg(version='"1.0\\n"'), "package.version", "1.0\n", "ASCII"),
    Case("version-leading-space", pkg(version='" 1.0"'), "package.version", " 1.0", "no spaces"),
    Case("version-arabic-digits", pkg(version='"\u0661.\u0660"'), "package.version",
         "\u0661.\u0660", "ASCII"),
    Case("version-fullwidth-digit", pkg(version='"\uff10.1"'), "package.version", "\uff10.1",
         "ASCII"),
    Case("version-not-pep440", pkg(version='"one"'), "package.version", "one", "PEP 440"),
    Case("version-underscore", pkg(version='"1.0_1"'), "package.version", "1.0_1", "PEP 440"),
    Case("version-letters", pkg(version='"1.0a.b"'), "package.version", "1.0a.b", "PEP 440"),
    Case("version-epoch", pkg(version='"1!2.0"'), "package.version", "1!2.0", "epoch"),
    Case("version-65-chars", pkg(version=f'"{"1" * 65}"'), "package.version", "1" * 65,
         "got 65"),
    Case("package-unknown-key", OK.replace("[[targets]]", 'author = "x"\n[[targets]]'),
         "package.author", "x", "unknown key"),
    # [build]
    Case("build-not-table", "build = 1\n" + OK, "build", 1, "must be a table"),
    Case("gpus-string", OK + '[build]\ngpus = "sm_90a"\n', "build.gpus", "sm_90a", "a list"),
    Case("gpus-empty", OK + "[build]\ngpus = []\n", "build.gpus", [], "must not be empty"),
    Case("gpus-sm80", OK + '[build]\ngpus = ["sm_80"]\n', "build.gpus[0]", "sm_80", "unsupported"),
    Case("gpus-int", OK + "[build]\ngpus = [90]\n", "build.gpus[0]", 90, "must be a string"),
    Case("dtypes-fp32", OK + '[build]\ndtypes = ["fp32"]\n', "build.dtypes[0]", "fp32",
         "supported: fp16, bf16"),
    Case("dtypes-empty", OK + "[build]\ndtypes = []\n", "build.dtypes", [], "must not be empty"),
    Case("layouts-nt", OK + '[build]\nlayouts = ["nt"]\n', "build.layouts[0]", "nt", "unsupported"),
    Case("layouts-string", OK + '[build]\nlayouts = "tn"\n', "build.layouts", "tn", "a list"),
    Case("build-unknown-key", OK + '[build]\narch = "sm_90a"\n', "build.arch", "sm_90a",
         "unknown key"),
    # [search]
    Case("proposer-unknown", OK + '[search]\nproposer = "magic"\n', "search.proposer", "magic",
         "unsupported"),
    Case("proposer-int", OK + "[search]\nproposer = 1\n", "search.proposer", 1, "a string"),
    Case("candidates-0", OK + "[search]\ncandidates = 0\n", "search.candidates", 0, "positive"),
    Case("candidates-negative", OK + "[search]\ncandidates = -1\n", "search.candidates", -1,
         "positive"),
    Case("candidates-bool", OK + "[search]\ncandidates = true\n", "search.candidates", True,
         "must be an integer"),
    Case("candidates-float", OK + "[search]\ncandidates = 8.0\n", "search.candidates", 8.0,
         "must be an integer"),
    Case("candidates-string", OK + '[search]\ncandidates = "8"\n', "search.candidates", "8",
         "must be an integer"),
    Case("candidates-million", OK + "[search]\ncandidates = 1000000\n", "search.candidates",
         1000000, "at most 4096"),
    Case("rounds-0", OK + "[search]\nrounds = 0\n", "search.rounds", 0, "positive"),
    Case("rounds-101", OK + "[search]\nrounds = 101\n", "search.rounds", 101, "at most 100"),
    Case("budget-0", OK + "[search]\ngpu_budget_s = 0\n", "search.gpu_budget_s", 0, "positive"),
    Case("budget-negative", OK + "[search]\ngpu_budget_s = -5.0\n", "search.gpu_budget_s", -5.0,
         "positive"),
    Case("budget-inf", OK + "[search]\ngpu_budget_s = inf\n", "search.gpu_budget_s",
         float("inf"), "finite"),
    Case("budget-nan", OK + "[search]\ngpu_budget_s = nan\n", "search.gpu_budget_s",
         float("nan"), "finite"),
    Case("budget-string", OK + '[search]\ngpu_budget_s = "30m"\n', "search.gpu_budget_s", "30m",
         "must be a number"),
    Case("seed-negative", OK + "[search]\nseed = -1\n", "search.seed", -1, ">= 0"),
    Case("seed-2**40", OK + f"[search]\nseed = {2**40}\n", "search.seed", 2**40, "at most"),
    Case("profile-top-negative", OK + "[search]\nprofile_top = -1\n", "search.profile_top", -1,
         ">= 0"),
    Case("profile-metrics-unknown", OK + '[search]\nprofile_metrics = "some"\n',
         "search.profile_metrics", "some", "unsupported; supported: search, all"),
    Case("profile-metrics-list", OK + '[search]\nprofile_metrics = ["all"]\n',
         "search.profile_metrics", ["all"], "must be a string"),
    Case("profile-metrics-bool", OK + "[search]\nprofile_metrics = true\n",
         "search.profile_metrics", True, "must be a string"),
    Case("profile-last-round-string", OK + '[search]\nprofile_last_round = "yes"\n',
         "search.profile_last_round", "yes", "true or false"),
    Case("profile-last-round-int", OK + "[search]\nprofile_last_round = 1\n",
         "search.profile_last_round", 1, "true or false"),
    Case("profile-lag-2", OK + "[search]\nprofile_lag = 2\n", "search.profile_lag", 2,
         "at most 1"),
    Case("profile-lag-negative", OK + "[search]\nprofile_lag = -1\n", "search.profile_lag", -1,
         ">= 0"),
    Case("profile-lag-bool", OK + "[search]\nprofile_lag = true\n", "search.profile_lag", True,
         "must be an integer"),
    Case("profile-lag-string", OK + '[search]\nprofile_lag = "1"\n', "search.profile_lag", "1",
         "must be an integer"),
    Case("profile-lag-float", OK + "[search]\nprofile_lag = 1.0\n", "search.profile_lag", 1.0,
         "must be an integer"),
    Case("families-unknown", OK + '[search]\nfamilies = ["sm70"]\n', "search.families[0]",
         "sm70", "unsupported"),
    Case("families-empty", OK + "[search]\nfamilies = []\n", "search.families", [],
         "must not be empty"),
    Case("cublaslt-string", OK + '[search]\ncublaslt = "yes"\n', "search.cublaslt", "yes",
         "true or false"),
    Case("policy-updates-int", OK + "[search]\npolicy_updates = 1\n", "search.policy_updates", 1,
         "true or false"),
    Case("pdl-string", OK + '[search]\npdl = "true"\n', "search.pdl", "true", "true or false"),
    Case("pdl-int", OK + "[search]\npdl = 1\n", "search.pdl", 1, "true or false"),
    Case("pdl-list", OK + "[search]\npdl = [true]\n", "search.pdl", [True], "true or false"),
    Case("pdl-in-build", OK + "[build]\npdl = true\n", "build.pdl", True,
         "unknown key"),
    Case("room-string", OK + '[search]\npdl = true\nroom = "half"\n', "search.room", "half",
         "true or false"),
    Case("room-int", OK + "[search]\npdl = true\nroom = 1\n", "search.room", 1,
         "true or false"),
    Case("room-without-pdl", OK + "[search]\nroom = true\n", "search.room", True,
         "measured only with PDL launches: set search.pdl = true too"),
    Case("room-with-pdl-off", OK + "[search]\npdl = false\nroom = true\n", "search.room",
         True, "set search.pdl = true too"),
    Case("trial-string", OK + '[search]\ntrial = "yes"\n', "search.trial", "yes",
         "true or false"),
    Case("trial-with-room", OK + "[search]\npdl = true\nroom = true\ntrial = true\n",
         "search.trial", True, "searched without room designs: set search.room = false"),
    Case("search-unknown-key", OK + "[search]\ncandidate = 8\n", "search.candidate", 8,
         "unknown key"),
    # [timing]
    Case("timing-mode", OK + '[timing]\nmode = "fast"\n', "timing.mode", "fast", "unsupported"),
    Case("timing-unknown-key", OK + "[timing]\nrepeat = 3\n", "timing.repeat", 3, "unknown key"),
    # [[targets]]
    Case("no-groups", PKG, "targets", NONE, "no targets"),
    Case("targets-not-array", "targets = 1\n" + PKG, "targets", 1, "array of tables"),
    Case("targets-no-shapes", PKG + "[[targets]]\n", "targets[0].shapes", NONE, "missing"),
    Case("shapes-empty", PKG + "[[targets]]\nshapes = []\n", "targets[0].shapes", [],
         "must not be empty"),
    Case("shapes-string", PKG + '[[targets]]\nshapes = "64x4096x4096"\n', "targets[0].shapes",
         "64x4096x4096", "must be a list"),
    Case("shape-of-2", PKG + "[[targets]]\nshapes = [[64, 4096]]\n", "targets[0].shapes[0]",
         [64, 4096], "list of 3"),
    Case("dim-0", PKG + "[[targets]]\nshapes = [[0, 4096, 4096]]\n",
         "targets[0].shapes[0][0]", 0, "[1, 2147483647]"),
    Case("dim-negative", PKG + "[[targets]]\nshapes = [[64, -6144, 4096]]\n",
         "targets[0].shapes[0][1]", -6144, "[1, 2147483647]"),
    Case("dim-2**31", PKG + f"[[targets]]\nshapes = [[{2**31}, 8, 8]]\n",
         "targets[0].shapes[0][0]", 2**31, "[1, 2147483647]"),
    Case("dim-2**40", PKG + f"[[targets]]\nshapes = [[1, 8, {2**40}]]\n",
         "targets[0].shapes[0][2]", 2**40, "[1, 2147483647]"),
    Case("dim-string", PKG + '[[targets]]\nshapes = [[64, "4096", 4096]]\n',
         "targets[0].shapes[0][1]", "4096", "[1, 2147483647]"),
    Case("dim-float", PKG + "[[targets]]\nshapes = [[64, 4096.0, 4096]]\n",
         "targets[0].shapes[0][1]", 4096.0, "[1, 2147483647]"),
    Case("dim-bool", PKG + "[[targets]]\nshapes = [[true, 8, 8]]\n",
         "targets[0].shapes[0][0]", True, "[1, 2147483647]"),
    Case("targets-dtype", OK + '[[targets]]\nshapes = [[1, 8, 8]]\ndtypes = ["fp8"]\n',
         "targets[1].dtypes[0]", "fp8", "unsupported"),
    Case("targets-unknown-key", PKG + "[[targets]]\nshape = [[1, 8, 8]]\n", "targets[0].shape",
         [[1, 8, 8]], "unknown key"),
    Case("targets-10001-shapes", PKG + "[[targets]]\nshapes = ["
         + ", ".join(f"[{i}, 8, 8]" for i in range(1, 10002)) + "]\n",
         "targets[0]", 10001, "at most 10000"),
    # [[grid]]: bounded before it is expanded
    Case("grid-1000-per-axis", PKG + grid(1000, 1000, 1000), "grid[0]", 10**9, "at most 10000"),
    Case("grid-100-per-axis", PKG + grid(100, 100, 100), "grid[0]", 10**6, "at most 10000"),
    Case("grid-x-dtypes-x-layouts", PKG + grid(20, 20, 20, 'dtypes = ["fp16", "bf16"]\n'
         'layouts = ["tn", "nn"]\n'), "grid[0]", 32000, "2 dtypes x 2 layouts"),
    Case("grids-together", PKG + grid(20, 20, 20) + grid(20, 20, 20), "grid[1]", 16000,
         "the groups up to this one"),
    Case("grid-no-m", PKG + "[[grid]]\nn = [8]\nk = [8]\n", "grid[0].m", NONE, "missing"),
    Case("grid-m-empty", PKG + "[[grid]]\nm = []\nn = [8]\nk = [8]\n", "grid[0].m", [],
         "must not be empty"),
    Case("grid-k-0", PKG + "[[grid]]\nm = [1]\nn = [8]\nk = [0]\n", "grid[0].k[0]", 0,
         "[1, 2147483647]"),
    Case("grid-n-string", PKG + '[[grid]]\nm = [1]\nn = "8"\nk = [8]\n', "grid[0].n", "8",
         "must be a list"),
    Case("grid-unknown-key", PKG + "[[grid]]\nm = [1]\nn = [8]\nk = [8]\nb = [1]\n",
         "grid[0].b", [1], "unknown key"),
    # [[model]]: the config's own values, and the shapes they expand to
    Case("config-missing", PKG + MODEL, "model[0].config", NONE, "model config file not found"),
    Case("config-a-folder", _config_folder, "model[0].config", NONE,
         "config.json/config.json': model config file not found"),
    Case("config-dev-zero", PKG + "[[model]]\nconfig = '/dev/zero'\ntokens = [1]\n",
         "model[0].config", "/dev/zero", "not a regular file"),
    Case("config-nul-byte", PKG + '[[model]]\nconfig = "cfg\\u0000x"\ntokens = [1]\n',
         "model[0].config", "cfg\0x", "not a usable path"),
    Case("config-unknown-user", PKG + "[[model]]\nconfig = '~nosuchuser42/c.json'\ntokens = [1]\n",
         "model[0].config", "~nosuchuser42/c.json", "not a usable path"),
    Case("config-name-too-long", PKG + f"[[model]]\nconfig = '{'c' * 5000}'\ntokens = [1]\n",
         "model[0].config", "c" * 5000, "not a usable path"),
    Case("config-over-16MiB", _huge_config, "model[0].config", "cfg/config.json",
         "not a config.json"),
    Case("config-not-json", PKG + MODEL, "model[0].config", "cfg/config.json", "cannot read",
         {"cfg/config.json": b"{model_type: llama"}),
    Case("config-not-utf8", PKG + MODEL, "model[0].config", "cfg/config.json", "cannot read",
         {"cfg/config.json": b'{"model_type": "\xff"}'}),
    Case("config-array", PKG + MODEL, "model[0].config", "cfg/config.json", "not a JSON object",
         {"cfg/config.json": b"[1, 2]"}),
    Case("config-nested-deep", PKG + MODEL, "model[0].config", "cfg/config.json",
         "nested too deeply", {"cfg/config.json": b"[" * 100000 + b"]" * 100000}),
    Case("config-gpt2", PKG + MODEL, "model[0].config", "cfg/config.json",
         "model_type 'gpt2'", config(model_type="gpt2")),
    Case("config-no-model-type", PKG + MODEL, "model[0].config", "cfg/config.json",
         "model_type missing", config(model_type=None)),
    Case("config-hidden-2**40", PKG + MODEL, "model[0].config", "cfg/config.json",
         "projection 'qkv' gives K = 1099511627776", config(hidden_size=2**40, head_dim=64)),
    Case("config-inter-2**40", PKG + MODEL, "model[0].config", "cfg/config.json",
         "projection 'gate_up' gives N = 2199023255552", config(intermediate_size=2**40)),
    Case("config-head-dim-negative", PKG + MODEL, "model[0].config", "cfg/config.json",
         "head_dim must be a positive integer, got -128", config(head_dim=-128)),
    Case("config-hidden-0", PKG + MODEL, "model[0].config", "cfg/config.json",
         "hidden_size must be a positive integer", config(hidden_size=0)),
    Case("config-heads-string", PKG + MODEL, "model[0].config", "cfg/config.json",
         "num_attention_heads must be a positive integer, got '32'",
         config(num_attention_heads="32")),
    Case("tp-0", PKG + MODEL + "tp = 0\n", "model[0].tp", 0, "positive", config()),
    Case("tp-3", PKG + MODEL + "tp = 3\n", "model[0].tp", 3, "does not divide", config()),
    Case("tp-string", PKG + MODEL + 'tp = "2"\n', "model[0].tp", "2", "an integer", config()),
    Case("tokens-empty", PKG + "[[model]]\nconfig = 'cfg/config.json'\ntokens = []\n",
         "model[0].tokens", [], "must not be empty", config()),
    Case("tokens-0", PKG + "[[model]]\nconfig = 'cfg/config.json'\ntokens = [0]\n",
         "model[0].tokens[0]", 0, "[1, 2147483647]", config()),
    Case("fused-string", PKG + MODEL + 'fused = "yes"\n', "model[0].fused", "yes",
         "true or false", config()),
    Case("lm-head-string", PKG + MODEL + 'lm_head = "yes"\n', "model[0].lm_head", "yes",
         "true or false", config()),
    Case("lm-head-int", PKG + MODEL + "lm_head = 1\n", "model[0].lm_head", 1,
         "true or false", config()),
    Case("lm-head-vocab-0", PKG + MODEL + "lm_head = true\n", "model[0].config",
         "cfg/config.json", "vocab_size must be a positive integer, got 0", config(vocab_size=0)),
    Case("lm-head-vocab-2**40", PKG + MODEL + "lm_head = true\n", "model[0].config",
         "cfg/config.json", "projection 'lm_head' gives N = 1099511627776",
         config(vocab_size=2**40)),
    Case("lm-head-tp-vocab", PKG + MODEL + "lm_head = true\nfused = false\ntp = 2\n",
         "model[0].tp", 2, "tp=2 does not divide vocab_size=32001", config(vocab_size=32001)),
    Case("model-dtype", PKG + MODEL + 'dtypes = ["fp8"]\n', "model[0].dtypes[0]", "fp8",
         "unsupported", config()),
    Case("model-unknown-key", PKG + MODEL + "layers = 32\n", "model[0].layers", 32,
         "unknown key", config()),
    Case("model-config-int", PKG + "[[model]]\nconfig = 5\ntokens = [1]\n", "model[0].config", 5,
         "must be a string"),
    Case("model-3000-tokens", PKG + "[[model]]\nconfig = 'cfg/config.json'\ntokens = "
         + str(list(range(1, 3001))) + "\n", "model[0]", 12000, "at most 10000", config()),
]
# fmt: on


def _manifest(tmp: Path, case: Case) -> Path:
    for name, data in (case.files or {}).items():
        (tmp / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp / name).write_bytes(data)
    if callable(case.manifest):
        return case.manifest(tmp)
    path = tmp / "m.toml"
    data = case.manifest
    path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return path


def test_there_are_at_least_92_cases():
    assert len(CASES) >= 92
    assert len({c.id for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_a_hostile_manifest_exits_2_naming_it_and_writes_nothing(tmp_path, capsys, case):
    manifest = _manifest(tmp_path, case)
    out, db, cache = tmp_path / "dist", tmp_path / "db.jsonl", tmp_path / "cache"
    argv = [str(manifest), "--out", str(out), "--measurements", str(db), "--cache", str(cache)]
    assert build_cli.main(argv) == 2
    captured = capsys.readouterr()
    err = captured.err
    assert err.startswith("cudal2-build: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err and not captured.out
    if case.value is not NONE:  # "key = value", or the quoted line of a syntax error
        assert (f"{case.key} = " if case.key else "") + shown(case.value) in err, err
    if case.key:  # the key path itself, not a longer one that ends with it
        assert re.search(rf": {re.escape(case.key)}( = |: )", err), err
    assert case.says in err, err
    assert not out.exists() and not db.exists() and not cache.exists()


def test_an_unbounded_grid_fails_in_milliseconds(tmp_path, capsys):
    """Issue 17: 1000 values per axis took 8 GB to MemoryError, 100 per axis 165 s. The
    bound is checked from the axes' lengths before anything is expanded."""
    path = tmp_path / "m.toml"
    path.write_text(PKG + grid(1000, 1000, 1000))
    started = time.perf_counter()
    assert build_cli.main([str(path), "--out", str(tmp_path / "dist")]) == 2
    assert time.perf_counter() - started < 1.0  # the TOML parse is most of it
    assert "grid[0] = 1000000000: expands to 1000 x 1000 x 1000 shapes" in capsys.readouterr().err


def test_the_bound_admits_a_manifest_of_exactly_max_targets(tmp_path):
    """The bound is the schema's number, not one less: 100 x 100 shapes x 1 dtype x 1
    layout = 10,000 targets load."""
    from cudal2.manifest import load_manifest

    path = tmp_path / "m.toml"
    path.write_text(PKG + grid(100, 100, 1))
    assert len(load_manifest(path).targets) == MAX_TARGETS
