"""Hugging Face config.json -> projection shapes, on small real-world configs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cudal2 import models
from cudal2.models import (
    SUPPORTED_MODEL_TYPES,
    ModelConfigError,
    TensorParallelError,
    UnsupportedModelError,
    projection_shapes,
)

CONFIGS = Path(__file__).parent / "configs"
REPO = Path(__file__).resolve().parents[2]
LLAMA_8B = REPO / "manifests" / "configs" / "llama-3.1-8b" / "config.json"

FUSED_NAMES = ["qkv", "o", "gate_up", "down"]
UNFUSED_NAMES = ["q", "k", "v", "o", "gate", "up", "down"]


def _shapes(config: Path, tp: int = 1, fused: bool = True) -> dict[str, tuple[int, int]]:
    return {name: (n, k) for name, n, k in projection_shapes(config, tp, fused)}


def test_llama_3_1_8b_tp1() -> None:
    assert projection_shapes(LLAMA_8B, 1, True) == [
        ("qkv", 6144, 4096),
        ("o", 4096, 4096),
        ("gate_up", 28672, 4096),
        ("down", 4096, 14336),
    ]


def test_llama_3_1_70b_tp8() -> None:
    assert projection_shapes(CONFIGS / "llama-3.1-70b" / "config.json", 8, True) == [
        ("qkv", 1280, 8192),
        ("o", 8192, 1024),
        ("gate_up", 7168, 8192),
        ("down", 8192, 3584),
    ]


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        # TinyLlama: 32 query heads, 4 KV heads, head_dim 2048/32 = 64.
        ("tinyllama-1.1b", {"qkv": (2560, 2048), "o": (2048, 2048), "gate_up": (11264, 2048),
                            "down": (2048, 5632)}),
        ("mistral-7b", {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096),
                        "down": (4096, 14336)}),
        # Qwen2 configs carry no head_dim: 896 / 14 = 64.
        ("qwen2-0.5b", {"qkv": (1152, 896), "o": (896, 896), "gate_up": (9728, 896),
                        "down": (896, 4864)}),
        ("gemma-2b", {"qkv": (2560, 2048), "o": (2048, 2048), "gate_up": (32768, 2048),
                      "down": (2048, 16384)}),
        # Gemma-2: head_dim 256 with 8 heads is 2048, not hidden_size 2304; o's K follows heads.
        ("gemma-2-2b", {"qkv": (4096, 2304), "o": (2304, 2048), "gate_up": (18432, 2304),
                        "down": (2304, 9216)}),
        ("phi-3-mini", {"qkv": (9216, 3072), "o": (3072, 3072), "gate_up": (16384, 3072),
                        "down": (3072, 8192)}),
    ],
)  # fmt: skip
def test_fused_shapes(name: str, expected: dict[str, tuple[int, int]]) -> None:
    shapes = projection_shapes(CONFIGS / name / "config.json", 1, True)
    assert [s[0] for s in shapes] == FUSED_NAMES
    assert _shapes(CONFIGS / name / "config.json") == expected


@pytest.mark.parametrize("name", ["tinyllama-1.1b", "mistral-7b", "qwen2-0.5b", "gemma-2-2b"])
def test_unfused_splits_the_fused_projections(name: str) -> None:
    config = CONFIGS / name / "config.json"
    fused = _shapes(config, fused=True)
    unfused = _shapes(config, fused=False)
    assert list(unfused) == UNFUSED_NAMES
    assert unfused["q"][0] + unfused["k"][0] + unfused["v"][0] == fused["qkv"][0]
    assert unfused["k"] == unfused["v"]
    assert unfused["gate"] == unfused["up"]
    assert unfused["gate"][0] * 2 == fused["gate_up"][0]
    assert {unfused["o"], unfused["down"]} == {fused["o"], fused["down"]}
    assert {shape[1] for name, shape in unfused.items() if name not in ("o", "down")} == {
        fused["qkv"][1]
    }


def test_unfused_mistral_exact() -> None:
    assert projection_shapes(CONFIGS / "mistral-7b" / "config.json", 1, False) == [
        ("q", 4096, 4096),
        ("k", 1024, 4096),
        ("v", 1024, 4096),
        ("o", 4096, 4096),
        ("gate", 14336, 4096),
        ("up", 14336, 4096),
        ("down", 4096, 14336),
    ]


def test_phi3_modules_are_already_fused() -> None:
    config = CONFIGS / "phi-3-mini" / "config.json"
    assert projection_shapes(config, 1, False) == projection_shapes(config, 1, True)
    assert [s[0] for s in projection_shapes(config, 1, False)] == FUSED_NAMES


def test_directory_is_accepted() -> None:
    assert projection_shapes(CONFIGS / "mistral-7b", 1, True) == projection_shapes(
        CONFIGS / "mistral-7b" / "config.json", 1, True
    )


def test_tp_shards_heads_and_mlp() -> None:
    # Mistral-7B, tp 2: 16 query heads, 4 KV heads, MLP 7168 per rank.
    assert _shapes(CONFIGS / "mistral-7b", tp=2) == {
        "qkv": (3072, 4096),
        "o": (4096, 2048),
        "gate_up": (14336, 4096),
        "down": (4096, 7168),
    }


def test_fewer_kv_heads_than_ranks_are_replicated() -> None:
    # Gemma-2B has a single KV head: with tp 2 each rank keeps a copy of it.
    assert _shapes(CONFIGS / "gemma-2b", tp=2)["qkv"] == ((4 + 2 * 1) * 256, 2048)
    # Mistral-7B, tp 16: 2 query heads, 8 KV heads over 16 ranks -> 1 each.
    assert _shapes(CONFIGS / "mistral-7b", tp=16)["qkv"] == ((2 + 2 * 1) * 128, 4096)


def test_tp_not_dividing_heads_is_an_error() -> None:
    with pytest.raises(TensorParallelError, match=r"tp=4 does not divide num_attention_heads=14"):
        projection_shapes(CONFIGS / "qwen2-0.5b", 4, True)


def test_tp_not_dividing_mlp_is_an_error() -> None:
    # Qwen2-0.5B: 14 heads split 14 ways (2 KV heads replicated), but 4864 / 14 is not whole.
    with pytest.raises(TensorParallelError, match=r"tp=14 does not divide intermediate_size=4864"):
        projection_shapes(CONFIGS / "qwen2-0.5b", 14, True)


def test_tp_not_a_multiple_of_kv_heads_is_an_error() -> None:
    # Qwen2-0.5B: 14 query heads split 7 ways, but 2 KV heads cannot be replicated over 7.
    with pytest.raises(TensorParallelError, match=r"num_key_value_heads=2"):
        projection_shapes(CONFIGS / "qwen2-0.5b", 7, True)


@pytest.mark.parametrize("tp", [0, -2, True])
def test_tp_must_be_a_positive_int(tp: int) -> None:
    with pytest.raises(TensorParallelError, match="tp must be a positive integer"):
        projection_shapes(CONFIGS / "mistral-7b", tp, True)


def test_unsupported_architecture_names_model_type_and_supported_list() -> None:
    with pytest.raises(UnsupportedModelError) as info:
        projection_shapes(CONFIGS / "gpt2" / "config.json", 1, True)
    msg = str(info.value)
    assert "'gpt2'" in msg
    assert "GPT2LMHeadModel" in msg
    assert ", ".join(SUPPORTED_MODEL_TYPES) in msg
    assert isinstance(info.value, ValueError)


def test_model_type_unknown_to_transformers_gets_our_message(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "not_a_model"}))
    with pytest.raises(UnsupportedModelError, match="'not_a_model'.*supported model_type"):
        projection_shapes(tmp_path, 1, True)


def test_missing_model_type_is_unsupported(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 64}))
    with pytest.raises(UnsupportedModelError, match="model_type missing"):
        projection_shapes(tmp_path, 1, True)


def test_missing_config_file(tmp_path: Path) -> None:
    with pytest.raises(ModelConfigError, match="model config not found"):
        projection_shapes(tmp_path / "nope" / "config.json", 1, True)


def test_invalid_json(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ModelConfigError, match="cannot read model config"):
        projection_shapes(tmp_path, 1, True)


# (config, tp, fused) -> the LM head's (N, K): vLLM pads the vocabulary to a multiple
# of 64 and splits it tp ways; transformers' lm_head is the vocabulary itself.
LM_HEADS = [
    (LLAMA_8B, 1, True, (128256, 4096)),
    (CONFIGS / "llama-3.1-70b", 8, True, (16032, 8192)),
    (CONFIGS / "qwen2-0.5b", 2, True, (75968, 896)),
    (CONFIGS / "phi-3-mini", 1, False, (32064, 3072)),
    (CONFIGS / "gemma-2b", 1, True, (256000, 2048)),
]


@pytest.mark.parametrize(("config", "tp", "fused", "head"), LM_HEADS)
def test_lm_head_is_the_vocabulary_by_hidden_split_as_vllm_does(config, tp, fused, head) -> None:
    shapes = projection_shapes(config, tp, fused, lm_head=True)
    assert shapes[-1] == ("lm_head", *head)
    assert shapes[:-1] == projection_shapes(config, tp, fused)  # the layer is unchanged
    assert "lm_head" not in {name for name, _, _ in projection_shapes(config, tp, fused)}


def test_lm_head_pads_an_odd_vocabulary_only_where_vllm_does(tmp_path: Path) -> None:
    raw = json.loads((CONFIGS / "tinyllama-1.1b" / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**raw, "vocab_size": 32001}))
    assert projection_shapes(tmp_path, 2, True, lm_head=True)[-1] == ("lm_head", 16032, 2048)
    assert projection_shapes(tmp_path, 1, False, lm_head=True)[-1] == ("lm_head", 32001, 2048)
    with pytest.raises(TensorParallelError, match="tp=2 does not divide vocab_size=32001"):
        projection_shapes(tmp_path, 2, False, lm_head=True)


# The config reader's defaults (cudal2.models.CONFIG_DEFAULTS) against the installed
# transformers' config classes: every key the build reads, for a config that leaves
# every key out, for every config file the tests and manifests hold and each of them
# without each key, and for Llama's num_key_value_heads set to null.
def _config_files() -> list[Path]:
    files = sorted(CONFIGS.glob("*/config.json")) + sorted(
        (REPO / "manifests" / "configs").glob("*/config.json")
    )
    return [f for f in files if json.loads(f.read_text())["model_type"] in SUPPORTED_MODEL_TYPES]


def _variants() -> list[tuple[str, dict]]:
    rows = [(f"{mt}: no keys", {"model_type": mt}) for mt in SUPPORTED_MODEL_TYPES]
    llama = json.loads(LLAMA_8B.read_text())
    rows.append(("llama-3.1-8b: num_key_value_heads null", {**llama, "num_key_value_heads": None}))
    for f in _config_files():
        raw = json.loads(f.read_text())
        rows.append((f.parent.name, raw))
        rows += [
            (f"{f.parent.name} without {key}", {k: v for k, v in raw.items() if k != key})
            for key in models.CONFIG_KEYS
            if key in raw
        ]
    return rows


@pytest.mark.parametrize(("label", "raw"), _variants(), ids=[r[0] for r in _variants()])
def test_config_reader_agrees_with_transformers(tmp_path: Path, label: str, raw: dict) -> None:
    transformers = pytest.importorskip("transformers")
    (tmp_path / "config.json").write_text(json.dumps(raw))
    theirs = transformers.AutoConfig.from_pretrained(str(tmp_path), local_files_only=True)
    ours = models._load_config(tmp_path / "config.json")
    for key in models.CONFIG_KEYS:
        assert getattr(ours, key, None) == getattr(theirs, key, None), (label, key)


def test_building_targets_imports_no_transformers() -> None:
    """The manifest's model expansion reads JSON only: transformers (and torch with it)
    is not imported by it (a fresh GPU machine spent ~15 s there before the build)."""
    import subprocess
    import sys

    code = (
        "import sys; from cudal2.models import projection_shapes, patch_epilogues; "
        f"projection_shapes({str(LLAMA_8B)!r}, 1, True, lm_head=True); "
        f"patch_epilogues({str(LLAMA_8B)!r}, True); "
        "print(sorted(m for m in ('transformers', 'torch') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
