"""Hugging Face ``config.json`` -> the GEMM shapes of a decoder layer's projections.

A model's linear layers are ``y = x @ W^T`` with ``W`` of shape ``[N, K]``; with M
tokens in flight each one is the GEMM ``M x N x K`` (layout ``tn``). The projections
inside a decoder layer are returned (they run once per layer, so they dominate the
time), and on request the LM head (``lm_head``: once per forward, but its N is the
vocabulary); the embedding is a lookup, not a GEMM.

The config is read as JSON, with the defaults transformers' config classes fill in
for a key the file leaves out (``CONFIG_DEFAULTS``, e.g. Gemma's ``head_dim``), so the
shapes are the ones the model really runs with. transformers itself is not imported: it
pulls in torch, and on a fresh GPU machine that took ~15 s before a build's first line.
``tests/cudal2/test_models.py`` checks the table against the installed transformers.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from cudal2.packaging.runtime.families import FamilyError, fused_epilogues

SUPPORTED_MODEL_TYPES: tuple[str, ...] = ("llama", "mistral", "qwen2", "gemma", "gemma2", "phi3")

# Phi-3's transformers modules are already fused (qkv_proj, gate_up_proj), so its
# "unfused" expansion is the fused one.
_PREFUSED_MODEL_TYPES: frozenset[str] = frozenset({"phi3"})

# A model's config.json is a few kilobytes; one far larger is not a config.
MAX_CONFIG_BYTES = 16 << 20


class ModelConfigError(ValueError):
    """A model config that cannot be turned into projection shapes."""


class UnsupportedModelError(ModelConfigError):
    """The config's ``model_type`` is not one of ``SUPPORTED_MODEL_TYPES``."""


class TensorParallelError(ModelConfigError):
    """The tensor-parallel degree does not divide the model's heads or MLP width."""


def resolve_config_path(config_path: str | Path) -> Path:
    """The ``config.json`` file for ``config_path``, which may name the file or its folder."""
    path = Path(config_path).expanduser()
    return path / "config.json" if path.is_dir() else path


# The keys this module and the runtime's family table read, with the default each
# supported model type's transformers config class gives when config.json leaves the key
# out (transformers 5.x; None: derived below, or absent from that class). A test builds
# each class from a config without the key and checks these values.
CONFIG_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": {
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "intermediate_size": 11008,
        "num_key_value_heads": None,
        "head_dim": None,
        "vocab_size": 32000,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
    },
    "mistral": {
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "intermediate_size": 14336,
        "num_key_value_heads": 8,
        "head_dim": None,
        "vocab_size": 32000,
        "hidden_act": "silu",
    },
    "qwen2": {
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "intermediate_size": 22016,
        "num_key_value_heads": 32,
        "vocab_size": 151936,
        "hidden_act": "silu",
    },
    "gemma": {
        "hidden_size": 3072,
        "num_attention_heads": 16,
        "intermediate_size": 24576,
        "num_key_value_heads": 16,
        "head_dim": 256,
        "vocab_size": 256000,
        "hidden_act": "gelu_pytorch_tanh",
        "attention_bias": False,
    },
    "gemma2": {
        "hidden_size": 2304,
        "num_attention_heads": 8,
        "intermediate_size": 9216,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "vocab_size": 256000,
        "hidden_activation": "gelu_pytorch_tanh",
        "attention_bias": False,
    },
    "phi3": {
        "hidden_size": 3072,
        "num_attention_heads": 32,
        "intermediate_size": 8192,
        "num_key_value_heads": None,
        "vocab_size": 32064,
        "hidden_act": "silu",
    },
}
# The model types whose config class derives a missing head_dim as hidden_size //
# num_attention_heads (the others leave it missing, or default it: Gemma's 256).
HEAD_DIM_DERIVED = frozenset({"llama", "mistral"})
# Legacy values a config class replaces on load: Gemma's released configs say
# hidden_act "gelu", meant (and run by transformers) as the tanh approximation.
CONFIG_LEGACY: dict[str, dict[str, dict[str, str]]] = {
    "gemma": {"hidden_act": {"gelu": "gelu_pytorch_tanh"}},
}
# The keys of CONFIG_DEFAULTS, in one list: what ``_load_config`` answers for.
CONFIG_KEYS: tuple[str, ...] = tuple(sorted({k for d in CONFIG_DEFAULTS.values() for k in d}))


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _read_raw(path: Path) -> dict[str, Any]:
    """The config's JSON object (``ModelConfigError`` for a missing, oversized or
    unreadable file, or JSON that is not an object)."""
    try:
        size = path.stat().st_size
    except FileNotFoundError as e:
        raise ModelConfigError(f"model config not found: {path}") from e
    except OSError as e:
        raise ModelConfigError(f"cannot read model config {path}: {e}") from e
    if size > MAX_CONFIG_BYTES:
        raise ModelConfigError(
            f"model config {path} has more than {MAX_CONFIG_BYTES} bytes: not a config.json"
        )
    try:
        raw: Any = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as e:
        raise ModelConfigError(f"model config not found: {path}") from e
    except RecursionError as e:
        raise ModelConfigError(f"cannot read model config {path}: nested too deeply") from e
    except (OSError, ValueError) as e:  # UnicodeDecodeError, JSONDecodeError, 4300+ digits
        raise ModelConfigError(f"cannot read model config {path}: {e}") from e
    if not isinstance(raw, dict):
        raise ModelConfigError(f"model config {path} is not a JSON object")
    return raw


def _model_type(raw: dict[str, Any], path: Path) -> str:
    """The ``model_type`` of the config ``raw`` read from ``path``, checked against
    ``SUPPORTED_MODEL_TYPES`` (``UnsupportedModelError`` naming it, the architectures and
    the supported list)."""
    model_type = raw.get("model_type")
    archs = raw.get("architectures") or []
    arch_text = ", ".join(str(a) for a in archs) if isinstance(archs, list) else str(archs)
    if not isinstance(model_type, str) or model_type not in SUPPORTED_MODEL_TYPES:
        shown = repr(model_type) if model_type is not None else "missing"
        raise UnsupportedModelError(
            f"unsupported model architecture in {path}: model_type {shown}"
            + (f" (architectures: {arch_text})" if arch_text else "")
            + f"; supported model_type values: {', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    return model_type


def _load_config(path: Path) -> SimpleNamespace:
    """The config as attributes: every key of the file, and for a key of
    ``CONFIG_DEFAULTS`` the file leaves out, its model type's default; a missing
    ``num_key_value_heads`` is ``num_attention_heads`` (as the config classes derive
    it). Its ``model_type`` is checked here (``_model_type``), the other values where
    they are read."""
    raw = _read_raw(path)
    model_type = _model_type(raw, path)
    values = {**CONFIG_DEFAULTS[model_type], **raw}
    if values.get("num_key_value_heads") is None:  # Llama's and Phi-3's default, or null
        values["num_key_value_heads"] = values.get("num_attention_heads")
    if model_type in HEAD_DIM_DERIVED and values.get("head_dim") is None:
        hidden, heads = values.get("hidden_size"), values.get("num_attention_heads")
        if _is_int(hidden) and _is_int(heads) and heads > 0:
            values["head_dim"] = hidden // heads
    for key, legacy in CONFIG_LEGACY.get(model_type, {}).items():
        if isinstance(values.get(key), str) and values[key] in legacy:
            values[key] = legacy[values[key]]
    return SimpleNamespace(**{k: v for k, v in values.items() if isinstance(k, str)})


def _positive_int(config: Any, attr: str, path: Path) -> int:
    value = getattr(config, attr, None)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ModelConfigError(
            f"model config {path}: {attr} must be a positive integer, got {value!r}"
        )
    return value


def _shard(total: int, tp: int, what: str, path: Path) -> int:
    if total % tp:
        raise TensorParallelError(f"model config {path}: tp={tp} does not divide {what}={total}")
    return total // tp


# vLLM pads the vocabulary of its LM head (ParallelLMHead) to a multiple of this
# before splitting it across the tensor-parallel ranks (DEFAULT_VOCAB_PADDING_SIZE).
VLLM_VOCAB_PADDING = 64


def lm_head_rows(vocab: int, tp: int, fused: bool, path: Path) -> int:
    """N of the LM head on one rank: as vLLM runs it (``fused``: the vocabulary padded
    to a multiple of 64, then split ``tp`` ways), or as transformers' ``lm_head``
    module is (the vocabulary itself, split ``tp`` ways)."""
    if fused:
        vocab = -(-vocab // VLLM_VOCAB_PADDING) * VLLM_VOCAB_PADDING
        what = f"vocab_size padded to a multiple of {VLLM_VOCAB_PADDING} (as vLLM does)"
    else:
        what = "vocab_size"
    return _shard(vocab, tp, what, path)


def projection_shapes(
    config_path: Path, tp: int, fused: bool, lm_head: bool = False
) -> list[tuple[str, int, int]]:
    """(projection name, N, K) of one decoder layer on one tensor-parallel rank, and
    with ``lm_head`` the LM head's (``lm_head``, vocabulary rows, ``hidden_size``; see
    ``lm_head_rows``).

    ``config_path`` names a ``config.json`` or the folder holding it. With ``tp``
    ranks, query heads, key/value heads and the MLP width are split ``tp`` ways
    (column-parallel qkv/gate/up shard N, row-parallel o/down shard K); when there
    are fewer key/value heads than ranks they are replicated, one per rank, which
    needs ``tp`` to be a multiple of their count.

    ``fused=True`` gives the projections as serving engines run them: ``qkv``,
    ``o``, ``gate_up``, ``down``. ``fused=False`` gives them as transformers'
    modules are: ``q``, ``k``, ``v``, ``o``, ``gate``, ``up``, ``down`` — except
    Phi-3, whose transformers modules are already fused (``qkv_proj``,
    ``gate_up_proj``), so both settings give ``qkv``, ``o``, ``gate_up``, ``down``.

    Raises ``UnsupportedModelError`` (naming the model_type and the supported list)
    for other architectures, ``TensorParallelError`` when ``tp`` does not divide
    the model, and ``ModelConfigError`` for a missing or unreadable config; all are
    ``ValueError`` subclasses.
    """
    if isinstance(tp, bool) or not isinstance(tp, int) or tp <= 0:
        raise TensorParallelError(f"tp must be a positive integer, got {tp!r}")
    path = resolve_config_path(config_path)
    config = _load_config(path)
    model_type = config.model_type

    hidden, hq_rank, hkv_rank, head_dim = _head_split(config, path, tp)
    inter = _positive_int(config, "intermediate_size", path)
    inter_rank = _shard(inter, tp, "intermediate_size", path)

    head = []
    if lm_head:
        vocab = _positive_int(config, "vocab_size", path)
        head = [("lm_head", lm_head_rows(vocab, tp, fused, path), hidden)]

    q_n, kv_n = hq_rank * head_dim, hkv_rank * head_dim
    if fused or model_type in _PREFUSED_MODEL_TYPES:
        return [
            ("qkv", q_n + 2 * kv_n, hidden),
            ("o", hidden, q_n),
            ("gate_up", 2 * inter_rank, hidden),
            ("down", hidden, inter_rank),
            *head,
        ]
    return [
        ("q", q_n, hidden),
        ("k", kv_n, hidden),
        ("v", kv_n, hidden),
        ("o", hidden, q_n),
        ("gate", inter_rank, hidden),
        ("up", inter_rank, hidden),
        ("down", hidden, inter_rank),
        *head,
    ]


def _head_split(config: Any, path: Path, tp: int) -> tuple[int, int, int, int]:
    """(hidden_size, query heads, key/value heads, head_dim) on one of ``tp`` ranks (KV
    heads replicated, one per rank, when there are fewer than ranks)."""
    hidden = _positive_int(config, "hidden_size", path)
    hq = _positive_int(config, "num_attention_heads", path)
    hkv = getattr(config, "num_key_value_heads", None) or hq
    if isinstance(hkv, bool) or not isinstance(hkv, int) or hkv <= 0:
        raise ModelConfigError(
            f"model config {path}: num_key_value_heads must be positive, got {hkv!r}"
        )
    head_dim = getattr(config, "head_dim", None) or hidden // hq
    if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim <= 0:
        raise ModelConfigError(
            f"model config {path}: head_dim must be a positive integer, got {head_dim!r}"
        )

    hq_rank = _shard(hq, tp, "num_attention_heads", path)
    if hkv >= tp:
        hkv_rank = _shard(hkv, tp, "num_key_value_heads", path)
    else:
        # Fewer KV heads than ranks: each rank holds one replicated KV head, which
        # only lines up with the query heads when tp is a multiple of hkv.
        if tp % hkv:
            raise TensorParallelError(
                f"model config {path}: tp={tp} is not a multiple of num_key_value_heads={hkv}"
                " (KV heads are replicated when there are fewer than tp)"
            )
        hkv_rank = 1
    return hidden, hq_rank, hkv_rank, head_dim


def qkv_heads(config_path: Path, tp: int = 1) -> tuple[int, int, int]:
    """The fused qkv projection's head split on one of ``tp`` ranks, (q_heads, kv_heads,
    head_dim): a ROPE_KV target's ``heads``. Errors as ``projection_shapes``."""
    if isinstance(tp, bool) or not isinstance(tp, int) or tp <= 0:
        raise TensorParallelError(f"tp must be a positive integer, got {tp!r}")
    path = resolve_config_path(config_path)
    _, hq_rank, hkv_rank, head_dim = _head_split(_load_config(path), path, tp)
    return hq_rank, hkv_rank, head_dim


def patch_epilogues(config_path: Path, lm_head: bool) -> dict[str, tuple[str, ...]]:
    """Per fused projection (``qkv``, ``o``, ``gate_up``, ``down``, and ``lm_head`` with
    ``lm_head``), the fused epilogues a transformers model of this config runs when
    patched by a wheel's ``patch_model``: read from the runtime's own family table
    (``cudal2.packaging.runtime.families``), so the build asks for what the patch looks
    up. ``ModelConfigError`` naming the model type (and the value) it has no family for."""
    path = resolve_config_path(config_path)
    config = _load_config(path)
    model_type = config.model_type
    try:
        return fused_epilogues(model_type, config, lm_head)
    except FamilyError as e:
        raise ModelConfigError(f"model config {path}: {e}") from e
