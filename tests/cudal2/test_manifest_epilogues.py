"""``[[model]]`` ``epilogues``: per projection, the fused epilogues its linears need,
each expanding to targets of its own beside the plain ones (layout tn only: sm90tma);
bad values name the key path and the value (the CLI exits 2 on them)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cudal2.manifest import ManifestError, load_manifest

CONFIGS = Path(__file__).parent / "configs"
PACKAGE = '[package]\nname = "t"\nversion = "0.1.0"\n'
LLAMA = CONFIGS / "llama-3.1-70b"


def _model(config: Path, epilogues: str, extra: str = "") -> str:
    return (
        f"{PACKAGE}{extra}[[model]]\nconfig = '{config}'\ntokens = [1, 16]\ntp = 8\n"
        f"epilogues = {epilogues}\n"
    )


def _load(tmp_path: Path, text: str):
    path = tmp_path / "manifest.toml"
    path.write_text(text)
    return load_manifest(path)


def test_epilogues_expand_to_targets_beside_the_plain_ones(tmp_path):
    plain = _load(tmp_path, _model(LLAMA, "{}"))
    fused = _load(tmp_path, _model(LLAMA, "{ o = ['residual'], down = ['residual', 'bias'] }"))
    assert all(t.epilogue == "none" for t in plain.targets)
    extra = set(fused.targets) - set(plain.targets)
    assert set(plain.targets) < set(fused.targets)
    # llama-3.1-70b tp 8: o is 8192 x 1024, down 8192 x 3584; M 1 and 16
    want = {
        (m, 8192, k, e)
        for m in (1, 16)
        for k, es in ((1024, ("residual",)), (3584, ("residual", "bias")))
        for e in es
    }
    assert {(t.m, t.n, t.k, t.epilogue) for t in extra} == want
    assert all(t.layout == "tn" for t in extra)


def test_qwen2_qkv_gets_its_bias(tmp_path):
    m = _load(
        tmp_path, _model(CONFIGS / "qwen2-0.5b", "{ qkv = ['bias'] }").replace("tp = 8\n", "")
    )
    fused = [t for t in m.targets if t.epilogue != "none"]
    assert fused and {t.epilogue for t in fused} == {"bias"}
    assert len(fused) == 2  # one qkv shape, M = 1 and 16


def test_an_nn_layout_gets_no_epilogue_targets(tmp_path):
    m = _load(tmp_path, _model(LLAMA, "{ o = ['residual'] }", "[build]\nlayouts = ['tn', 'nn']\n"))
    assert {t.layout for t in m.targets if t.epilogue != "none"} == {"tn"}
    assert {t.layout for t in m.targets if t.epilogue == "none"} == {"tn", "nn"}


# (the epilogues value, the key path named, the value named)
BAD: list[tuple[str, str, Any]] = [
    ("['residual']", "model[0].epilogues", ["residual"]),
    ("'residual'", "model[0].epilogues", "residual"),
    ("{ o_proj = ['residual'] }", "model[0].epilogues.o_proj", ["residual"]),
    ("{ o = 'residual' }", "model[0].epilogues.o", "residual"),
    ("{ o = [] }", "model[0].epilogues.o", []),
    ("{ o = ['gelu'] }", "model[0].epilogues.o[0]", "gelu"),
    ("{ o = ['none'] }", "model[0].epilogues.o[0]", "none"),
    ("{ o = [1] }", "model[0].epilogues.o[0]", 1),
    ("{ down = ['residual', 'Residual'] }", "model[0].epilogues.down[1]", "Residual"),
]


@pytest.mark.parametrize(("value", "key_path", "named"), BAD, ids=[b[0] for b in BAD])
def test_bad_epilogues_name_key_path_and_value(tmp_path, value, key_path, named):
    with pytest.raises(ManifestError) as info:
        _load(tmp_path, _model(LLAMA, value))
    assert info.value.key_path == key_path
    assert info.value.value == named
    assert key_path in str(info.value)


def test_the_cli_exits_2_on_a_bad_epilogue(tmp_path):
    from cudal2.cli.build import main

    path = tmp_path / "manifest.toml"
    path.write_text(_model(LLAMA, "{ o = ['gelu'] }"))
    assert main([str(path), "--dry-run"]) == 2


def test_the_gated_and_row_scaled_epilogues_expand_to_targets(tmp_path):
    """The layer benchmark's set: qkv rmsnorm, gate_up rmsnorm_silu, o and down
    residual (llama-3.1-70b tp 8: gate_up packs 2 x 3584 rows, its output 3584 wide)."""
    m = _load(
        tmp_path,
        _model(
            LLAMA,
            "{ qkv = ['rmsnorm'], gate_up = ['rmsnorm_silu', 'silu'], o = ['residual'], "
            "down = ['residual'] }",
        ),
    )
    fused = {(t.m, t.n, t.k, t.epilogue, t.out_n) for t in m.targets if t.epilogue != "none"}
    want = {
        (mm, n, k, e, out_n)
        for mm in (1, 16)
        for n, k, e, out_n in (
            (1280, 8192, "rmsnorm", 1280),
            (7168, 8192, "rmsnorm_silu", 3584),
            (7168, 8192, "silu", 3584),
            (8192, 1024, "residual", 8192),
            (8192, 3584, "residual", 8192),
        )
    }
    assert fused == want


def _odd_mlp(tmp_path: Path) -> Path:
    """tinyllama with an odd MLP width: ``up`` (unfused projections) has an odd N."""
    import json

    config = json.loads((CONFIGS / "tinyllama-1.1b" / "config.json").read_text())
    config["intermediate_size"] = 5633
    folder = tmp_path / "odd"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    return folder


# (the epilogues value, fused projections?, the key path named, the value named)
BAD_GATED: list[tuple[str, bool, str, Any]] = [
    ("{ up = ['silu'] }", False, "model[0].epilogues.up[0]", "silu"),
    ("{ up = ['residual', 'rmsnorm_gelu_tanh'] }", False, "model[0].epilogues.up[1]",
     "rmsnorm_gelu_tanh"),
    ("{ gate_up = ['swiglu'] }", True, "model[0].epilogues.gate_up[0]", "swiglu"),
    ("{ qkv = ['rms_norm'] }", True, "model[0].epilogues.qkv[0]", "rms_norm"),
    ("{ gate_up = ['rmsnorm_silu'] }", False, "model[0].epilogues.gate_up", ["rmsnorm_silu"]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("value", "fused", "key_path", "named"), BAD_GATED, ids=[b[0] for b in BAD_GATED]
)
def test_bad_gated_epilogues_name_key_path_and_value(tmp_path, value, fused, key_path, named):
    text = _model(_odd_mlp(tmp_path), value).replace("tp = 8\n", f"fused = {str(fused).lower()}\n")
    with pytest.raises(ManifestError) as info:
        _load(tmp_path, text)
    assert info.value.key_path == key_path
    assert info.value.value == named
    assert key_path in str(info.value)


def test_an_even_n_takes_a_gated_epilogue_and_the_cli_exits_2_on_an_odd_one(tmp_path):
    from cudal2.cli.build import main

    config = _odd_mlp(tmp_path)
    # packed gate_up: 2 x 5633 rows, even
    m = _load(tmp_path, _model(config, "{ gate_up = ['silu'] }").replace("tp = 8\n", ""))
    assert {(t.n, t.out_n) for t in m.targets if t.epilogue == "silu"} == {(11266, 5633)}
    path = tmp_path / "manifest.toml"
    path.write_text(_model(config, "{ up = ['silu'] }").replace("tp = 8\n", "fused = false\n"))
    assert main([str(path), "--dry-run"]) == 2
