"""``[[model]]`` ``epilogues = "auto"``: the fused epilogues a wheel's ``patch_model`` runs
for the model's architecture, read from the runtime's own family table
(``cudal2.packaging.runtime.families``); hostile values name the key path and the model
type (the CLI exits 2 on them)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cudal2.manifest import ManifestError, load_manifest
from cudal2.packaging.runtime import families

CONFIGS = Path(__file__).parent / "configs"
PACKAGE = '[package]\nname = "t"\nversion = "0.1.0"\n'
LLAMA_STYLE = {"qkv": "rmsnorm", "o": "residual", "gate_up": "rmsnorm_silu", "down": "residual"}

# (config folder, the epilogue per projection "auto" gives)
AUTO = [
    ("tinyllama-1.1b", LLAMA_STYLE),
    ("mistral-7b", LLAMA_STYLE),
    ("qwen2-0.5b", {**LLAMA_STYLE, "qkv": "rmsnorm_bias"}),
    # Gemma: its (1 + w) norms fold like any other; GeLU-tanh gating (the config's legacy
    # hidden_act "gelu" is read as transformers reads it: gelu_pytorch_tanh)
    ("gemma-2b", {**LLAMA_STYLE, "gate_up": "rmsnorm_gelu_tanh"}),
    ("phi-3-mini", LLAMA_STYLE),
    # Gemma-2: post-norms sit between o / down and the residual add: those run plain
    ("gemma-2-2b", {"qkv": "rmsnorm", "gate_up": "rmsnorm_gelu_tanh"}),
]


def _model(config: Path, epilogues: str, extra: str = "") -> str:
    return (
        f"{PACKAGE}[[model]]\nconfig = '{config}'\ntokens = [1, 16]\n"
        f"epilogues = {epilogues}\n{extra}"
    )


def _load(tmp_path: Path, text: str):
    path = tmp_path / "manifest.toml"
    path.write_text(text)
    return load_manifest(path)


def _fused(manifest) -> dict[tuple[int, int], set[str]]:
    out: dict[tuple[int, int], set[str]] = {}
    for t in manifest.targets:
        if t.epilogue != "none":
            out.setdefault((t.n, t.k), set()).add(t.epilogue)
    return out


@pytest.mark.parametrize(("folder", "want"), AUTO, ids=[a[0] for a in AUTO])
def test_auto_gives_what_patch_model_runs(tmp_path, folder, want):
    m = _load(tmp_path, _model(CONFIGS / folder, '"auto"'))
    explicit = ", ".join(f"{p} = ['{e}']" for p, e in want.items())
    by_hand = _load(tmp_path, _model(CONFIGS / folder, "{ " + explicit + " }"))
    assert m.targets == by_hand.targets
    assert {e for es in _fused(m).values() for e in es} == set(want.values())
    assert len([t for t in m.targets if t.epilogue != "none"]) == 2 * len(want)  # M 1, 16


def test_auto_with_the_lm_head_adds_its_folded_norm(tmp_path):
    m = _load(tmp_path, _model(CONFIGS / "tinyllama-1.1b", '"auto"', "lm_head = true\n"))
    # tinyllama: vocabulary 32000 x hidden 2048, the final norm folded: rmsnorm
    assert _fused(m)[(32000, 2048)] == {"rmsnorm"}
    assert {(t.n, t.k) for t in m.targets if t.epilogue == "none"} >= {(32000, 2048)}


def test_auto_is_the_runtime_table(tmp_path, monkeypatch):
    """One source of truth: change the family table, and "auto" follows (the test can fail)."""
    broken = families.Family("Llama", qkv_bias=True)
    monkeypatch.setitem(families.FAMILIES, "llama", broken)
    m = _load(tmp_path, _model(CONFIGS / "tinyllama-1.1b", '"auto"'))
    assert "rmsnorm_bias" in {e for es in _fused(m).values() for e in es}


def _config(tmp_path: Path, base: str, **changes) -> Path:
    config = json.loads((CONFIGS / base / "config.json").read_text())
    config.update(changes)
    folder = tmp_path / "cfg"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


# (config base, config changes, extra manifest lines, epilogues value, key path, in message)
HOSTILE = [
    ("tinyllama-1.1b", {}, "fused = false\n", '"auto"', "model[0].epilogues", "fused = true"),
    ("tinyllama-1.1b", {}, "", '"automatic"', "model[0].epilogues", 'or "auto"'),
    ("tinyllama-1.1b", {}, "", '"Auto"', "model[0].epilogues", 'or "auto"'),
    ("tinyllama-1.1b", {}, "", "true", "model[0].epilogues", 'or "auto"'),
    ("tinyllama-1.1b", {"hidden_act": "gelu"}, "", '"auto"', "model[0].epilogues", "llama"),
    ("tinyllama-1.1b", {"hidden_act": "relu"}, "", '"auto"', "model[0].epilogues", "'relu'"),
    (
        "tinyllama-1.1b",
        {"attention_bias": True},
        "",
        '"auto"',
        "model[0].epilogues",
        "attention_bias = True",
    ),
    ("qwen2-0.5b", {"mlp_bias": True}, "", '"auto"', "model[0].epilogues", "qwen2: mlp_bias"),
]


@pytest.mark.parametrize("row", HOSTILE, ids=[f"{h[0]}-{h[1]}-{h[3]}" for h in HOSTILE])
def test_hostile_auto_names_key_path_and_model(tmp_path, row):
    base, changes, extra, value, key_path, message = row
    with pytest.raises(ManifestError) as info:
        _load(tmp_path, _model(_config(tmp_path, base, **changes), value, extra))
    assert info.value.key_path == key_path
    assert key_path in str(info.value) and message in str(info.value)


def test_a_model_type_without_a_family_names_it(tmp_path, monkeypatch):
    """A model type the config reader takes but patch_model has no family for (today the
    two lists are equal: a new architecture added to one and not the other)."""
    monkeypatch.delitem(families.FAMILIES, "mistral")
    with pytest.raises(ManifestError) as info:
        _load(tmp_path, _model(CONFIGS / "mistral-7b", '"auto"'))
    assert info.value.key_path == "model[0].epilogues"
    assert "model_type 'mistral' has no patch_model family" in str(info.value)


def test_the_cli_exits_2_on_a_hostile_auto(tmp_path, capsys):
    from cudal2.cli.build import main

    path = tmp_path / "manifest.toml"
    path.write_text(_model(CONFIGS / "tinyllama-1.1b", '"auto"', "fused = false\n"))
    assert main([str(path), "--dry-run"]) == 2
    assert "model[0].epilogues" in capsys.readouterr().err
