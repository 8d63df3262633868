"""Per-GPU LoRA adapters on the base policy (peft).

The H100 and the H200 are both sm_90a, but the H200 has 43% more bandwidth, so decode
shapes shift toward designs with more compute per byte. An adapter is a low-rank update
of the base's attention and MLP projections (rank 8, 49 k parameters against the base's
0.67 M). It is trained on one GPU model's measurements with the base's own recipe
(behaviour cloning, then GRPO with the base as the KL reference), and saved by peft
(``adapter_config.json`` + ``adapter_model.safetensors``). The prompt's GPU tokens
(bandwidth, FLOP/s) tell the model which GPU it proposes for.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cudal2.policy import model as pm
from cudal2.policy.corpus import Corpus
from cudal2.policy.train import Context, TrainConfig, behaviour_clone, grpo

LORA_TARGETS = ["c_attn", "c_proj", "c_fc"]  # GPT2's attention and MLP projections
ADAPTER_TRAIN = TrainConfig(bc_steps=150, grpo_steps=60, bc_lr=1e-3, grpo_lr=3e-4)


def lora_config(rank: int = 8) -> Any:
    from peft import LoraConfig

    # GPT2's projections are Conv1D (weights stored transposed): fan_in_fan_out.
    return LoraConfig(
        r=rank,
        lora_alpha=2 * rank,
        target_modules=LORA_TARGETS,
        fan_in_fan_out=True,
        lora_dropout=0.0,
    )


def train_adapter(
    base: str | Path,
    corpus: Corpus,
    cfg: TrainConfig = ADAPTER_TRAIN,
    log: Callable[[str], None] = print,
) -> tuple[Any, pm.ModelConfig, dict[str, Any]]:
    """An adapter on checkpoint ``base`` from ``corpus``'s train split (one GPU model)."""
    import torch
    from peft import get_peft_model

    torch.manual_seed(cfg.seed)
    model, mcfg, base_info = pm.load(base)
    ref, _, _ = pm.load(base)  # the KL reference: the base, frozen
    for p in ref.parameters():
        p.requires_grad_(False)
    model = get_peft_model(model, lora_config())
    ctx = Context(corpus)
    started = time.monotonic()
    behaviour_clone(model, ctx, cfg, mcfg, log)
    grpo(model, ref, ctx, cfg, mcfg, log)
    model.eval()
    info = {
        "base": Path(base).name,
        "base_sha256": base_sha256(base),
        "base_vocab_hash": pm.vocab_hash(),
        "gpu": corpus.gpu,
        "train": dataclasses.asdict(cfg),
        "train_targets": [t.label for t in corpus.targets("train")],
        "holdout_targets": [t.label for t in corpus.targets("holdout")],
        "seconds": round(time.monotonic() - started, 1),
        "base_info_seconds": base_info.get("seconds"),
    }
    return model, mcfg, info


def save_adapter(model: Any, out: str | Path, info: dict[str, Any]) -> None:
    """Write the adapter folder ``out`` (peft's files and ``cudal2_adapter.json``) whole:
    it is filled under a temporary name beside ``out`` and renamed into place, so a
    reader never loads half an adapter (weights without the base they belong to, or
    the other way round), and a killed ``adapt`` leaves the old adapter as it was."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}."))
    try:
        model.save_pretrained(str(tmp))
        (tmp / "README.md").unlink(missing_ok=True)  # peft's blank model card
        meta = json.dumps(info, indent=1, sort_keys=True) + "\n"
        (tmp / "cudal2_adapter.json").write_text(meta)
        for f in tmp.iterdir():
            f.chmod(0o644)
        tmp.chmod(0o755)  # mkdtemp's 0700 is not what a shipped folder needs
        _replace_folder(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _replace_folder(new: Path, final: Path) -> None:
    """Rename ``new`` to ``final``. A folder cannot be renamed over a non-empty one, so
    an old ``final`` is first renamed aside (both renames are atomic; between them
    ``final`` is briefly absent, never partial) and removed after."""
    if not final.exists():
        os.replace(new, final)
        return
    old = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}.old."))
    os.replace(final, old / final.name)
    try:
        os.replace(new, final)
    except BaseException:
        os.replace(old / final.name, final)  # put the old adapter back
        raise
    finally:
        shutil.rmtree(old, ignore_errors=True)


def base_sha256(base: str | Path) -> str:
    """The sha256 of a base checkpoint's weights: an adapter is a delta of one base."""
    return hashlib.sha256(Path(base).with_suffix(".safetensors").read_bytes()).hexdigest()


def check_base(adapter: str | Path, base: str | Path | None) -> None:
    """Raise ValueError unless ``adapter`` was trained for this vocabulary and (where
    ``base`` is given and the adapter names one) on exactly this base checkpoint: its
    deltas mean nothing on other weights."""
    meta_path = Path(adapter) / "cudal2_adapter.json"
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    want = meta.get("base_vocab_hash")
    # a base trained before the last tokens were appended is loaded extended
    # (model.load); a LoRA delta of its projections is as valid on it
    if not isinstance(want, str) or pm.vocab_prefix(want) is None:
        raise ValueError(
            f"{adapter}: trained for vocabulary {want}, this version's is {pm.vocab_hash()}: "
            "retrain the adapter (cudal2-policy adapt)"
        )
    if base is not None and meta.get("base_sha256") not in (None, base_sha256(base)):
        raise ValueError(
            f"{adapter}: trained on another base than {base} (sha256 differs): retrain it"
        )


def merge_lora(model: Any, adapter: str | Path, base: str | Path | None = None) -> Any:
    """Add a LoRA adapter folder's low-rank updates into ``model``'s weights in place,
    without peft (the GPU machine's image has no peft): W += (B @ A)^T * alpha / r for
    each Conv1D projection (fan_in_fan_out). Refuses adapter kinds this does not
    implement (DoRA, rsLoRA, per-module ranks, trained biases)."""
    import json

    import torch
    from safetensors.torch import load_file

    adapter = Path(adapter)
    check_base(adapter, base)
    cfg_path, weights = adapter / "adapter_config.json", adapter / "adapter_model.safetensors"
    for p in (cfg_path, weights):
        if not p.exists():
            raise FileNotFoundError(f"{adapter}: no {p.name} (not a peft LoRA adapter folder)")
    cfg = json.loads(cfg_path.read_text())
    unsupported = {
        "peft_type": cfg.get("peft_type") != "LORA",
        "use_dora": bool(cfg.get("use_dora")),
        "use_rslora": bool(cfg.get("use_rslora")),
        "rank_pattern": bool(cfg.get("rank_pattern")),
        "alpha_pattern": bool(cfg.get("alpha_pattern")),
        "bias": cfg.get("bias", "none") != "none",
        "fan_in_fan_out": not cfg.get("fan_in_fan_out"),
    }
    bad = [f"{k}={cfg.get(k)!r}" for k, v in unsupported.items() if v]
    if bad:
        raise ValueError(f"{cfg_path}: cannot merge this adapter without peft ({', '.join(bad)})")
    scale = cfg["lora_alpha"] / cfg["r"]
    state = load_file(str(weights))
    prefix, suffix_a = "base_model.model.", ".lora_A.weight"
    modules = dict(model.named_modules())
    merged = 0
    with torch.no_grad():
        for key, a in sorted(state.items()):
            if not key.endswith(suffix_a):
                continue
            name = key[len(prefix) : -len(suffix_a)]
            b = state.get(f"{prefix}{name}.lora_B.weight")
            if not key.startswith(prefix) or b is None or name not in modules:
                raise ValueError(f"{weights}: {key} has no matching module or lora_B")
            modules[name].weight += (b @ a).T.to(modules[name].weight.dtype) * scale
            merged += 1
    if merged == 0 or merged * 2 != len(state):
        raise ValueError(f"{weights}: {len(state)} tensors, {merged} LoRA pairs merged")
    return model


def load_with_adapter(base: str | Path, adapter: str | Path) -> tuple[Any, pm.ModelConfig]:
    from peft import PeftModel

    adapter = Path(adapter)
    if not (adapter / "adapter_config.json").exists():
        raise FileNotFoundError(f"{adapter}: no adapter_config.json (not a peft adapter folder)")
    check_base(adapter, base)
    model, mcfg, _ = pm.load(base)
    model = PeftModel.from_pretrained(model, str(adapter))
    model.eval()
    return model, mcfg
