"""The Llama-3.1-8B model the experiments run: transformers' ``LlamaForCausalLM`` with
the committed config (``manifests/configs/llama-3.1-8b``), ``layers`` decoder layers,
random fp16 weights (seeded) on the GPU, and a patched copy that shares its weights.
Imported by the scripts beside it (run as ``python bench/experiments/<name>.py``, their
folder is on ``sys.path``)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

CONFIG = Path(__file__).resolve().parents[2] / "manifests/configs/llama-3.1-8b"


def config(layers: int) -> Any:
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(str(CONFIG), local_files_only=True)
    cfg.num_hidden_layers = layers
    return cfg


def model(cfg: Any, dtype: Any = None, seed: int = 0) -> Any:
    """The model in ``dtype`` (fp16 by default) on CUDA, in eval mode; torch's default
    dtype is left as it was."""
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    before = torch.get_default_dtype()
    try:
        with torch.device("cuda"):
            torch.set_default_dtype(dtype or torch.float16)
            return LlamaForCausalLM(cfg).eval()
    finally:
        torch.set_default_dtype(before)


def patched_copy(model: Any, pkg: Any) -> tuple[Any, Any]:
    """New modules over the same parameters and buffers, patched by ``pkg``: (the copy,
    its patch)."""
    shared = {id(t): t for t in [*model.parameters(), *model.buffers()]}
    patched = copy.deepcopy(model, shared)
    assert all(p is q for p, q in zip(model.parameters(), patched.parameters(), strict=True))
    return patched, pkg.patch_linear(patched)
