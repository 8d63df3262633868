"""The decoder families ``patch_model`` knows, and the fused GEMMs each runs: one table,
read by ``patch_model`` (what a patched layer launches) and by the build (a manifest's
``[[model]]`` with ``epilogues = "auto"`` gets a target for each of those GEMMs), so the
wheel is built for exactly what the patched model asks the table for.

Self-contained (ships inside wheels as ``_runtime``): the standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# transformers' hidden_act names of the gated activations the fused ops compute exactly
# (ACT2FN: "silu" / "swish" are F.silu, "gelu_pytorch_tanh" is F.gelu(approximate="tanh")).
ACTS = {"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh"}
# The projections of a decoder layer as the fused forward runs them (the manifest's names
# for a ``fused = true`` model), and the LM head.
PROJECTIONS = ("qkv", "o", "gate_up", "down")
LM_HEAD = "lm_head"


@dataclass(frozen=True)
class Family:
    """What differs between the decoder families: the class-name prefix of their
    modules, the norms' ``(1 + w)`` offset, the config key of the activation, which
    modules are already fused (Phi-3), whether q/k/v carry a bias, whether the
    attention/MLP outputs are normalised before the residual add (Gemma-2), and the
    extra arguments their attention passes the attention function."""

    prefix: str
    norm_offset: float = 0.0
    act_key: str = "hidden_act"
    fused_modules: bool = False
    qkv_bias: bool = False
    post_norms: bool = False
    attn_kwargs: Any = None  # (attention module) -> dict


@dataclass(frozen=True)
class Gemm:
    """One GEMM of a patched decoder layer (or the LM head): its projection (the
    manifest's name), the op that runs it and the table epilogue that op looks up
    (``none``: a plain ``linear``, which falls back to the same ``F.linear`` the model
    runs)."""

    proj: str
    op: str
    epilogue: str


def _sliding_config(attn: Any) -> dict:
    return {"sliding_window": getattr(attn.config, "sliding_window", None)}


def _sliding_layer(attn: Any) -> dict:
    return {"sliding_window": attn.sliding_window}


def _gemma2_kwargs(attn: Any) -> dict:
    return {"sliding_window": attn.sliding_window, "softcap": attn.attn_logit_softcapping}


FAMILIES: dict[str, Family] = {
    "llama": Family("Llama"),
    "mistral": Family("Mistral", attn_kwargs=_sliding_config),
    "qwen2": Family("Qwen2", qkv_bias=True, attn_kwargs=_sliding_layer),
    "gemma": Family("Gemma", norm_offset=1.0),
    "phi3": Family("Phi3", fused_modules=True, attn_kwargs=_sliding_config),
    "gemma2": Family(
        "Gemma2",
        norm_offset=1.0,
        act_key="hidden_activation",
        post_norms=True,
        attn_kwargs=_gemma2_kwargs,
    ),
}


def layer_gemms(fam: Family, act: str) -> tuple[Gemm, ...]:
    """The GEMMs of one patched decoder layer of ``fam`` (``act``: the fused op's
    activation, a value of ``ACTS``): qkv with the input norm folded (and the bias),
    o and down with the residual add (Gemma-2: plain, its post-norms sit between the GEMM
    and the add), gate_up with the post-attention norm folded and the gate."""
    plain = fam.post_norms
    return (
        Gemm("qkv", "linear_rmsnorm", "rmsnorm_bias" if fam.qkv_bias else "rmsnorm"),
        Gemm("o", "linear", "none") if plain else Gemm("o", "linear_residual", "residual"),
        Gemm("gate_up", "linear_gated", f"rmsnorm_{act}"),
        Gemm("down", "linear", "none") if plain else Gemm("down", "linear_residual", "residual"),
    )


# The LM head with the final norm folded in (``head="rmsnorm"``), or plain (``"linear"``).
HEADS = {
    "rmsnorm": Gemm(LM_HEAD, "linear_rmsnorm", "rmsnorm"),
    "linear": Gemm(LM_HEAD, "linear", "none"),
}


# Config keys whose True means a bias the families' fused forward does not carry.
BIAS_KEYS = ("attention_bias", "mlp_bias")


class FamilyError(ValueError):
    """A model type (or a configuration of it) no family of ``patch_model`` runs."""


def fused_epilogues(
    model_type: str, config: Any, lm_head: bool, head: str = "rmsnorm"
) -> dict[str, tuple[str, ...]]:
    """Per projection (``PROJECTIONS``, and ``lm_head`` with ``lm_head``), the fused
    epilogues ``patch_model`` looks up for a ``model_type`` model of ``config`` (its
    activation, ``Family.act_key``, and bias keys read as attributes): what a manifest's
    ``epilogues = "auto"`` builds. Projections that run plain are left out (their plain
    target is built anyway). ``FamilyError`` naming the value it does not know."""
    fam = FAMILIES.get(model_type)
    if fam is None:
        raise FamilyError(
            f"model_type {model_type!r} has no patch_model family (known: "
            f"{', '.join(sorted(FAMILIES))})"
        )
    act_value = getattr(config, fam.act_key, None)
    act = ACTS.get(act_value) if isinstance(act_value, str) else None
    if act is None:
        raise FamilyError(
            f"{model_type}: {fam.act_key} = {act_value!r} is not a gated activation the fused "
            f"ops compute (supported: {', '.join(sorted(ACTS))})"
        )
    for key in BIAS_KEYS:
        if getattr(config, key, False):
            raise FamilyError(
                f"{model_type}: {key} = True: the family's fused forward carries no such bias"
            )
    gemms = list(layer_gemms(fam, act))
    if lm_head:
        gemms.append(HEADS[head])
    return {g.proj: (g.epilogue,) for g in gemms if g.epilogue != "none"}
