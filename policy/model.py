"""The policy network: a small causal transformer (a transformers ``GPT2Config``, built from
scratch, no downloaded weights) over the policy's vocabulary, and the two ways it is
used: scoring a set of designs under one prompt (exact, for replay and training), and
sampling designs field by field under a grammar mask (for a build)."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from cudal2.policy.tokens import VOCAB, Grammar


@dataclass(frozen=True)
class ModelConfig:
    n_embd: int = 128
    n_layer: int = 3
    n_head: int = 4
    n_positions: int = 256
    max_history: int = 8
    seed: int = 0


def vocab_hash(vocab: Sequence[str] = VOCAB) -> str:
    return hashlib.sha256("\n".join(vocab).encode()).hexdigest()[:16]


def vocab_prefix(digest: str) -> int | None:
    """The length of this version's vocabulary prefix whose hash is ``digest`` (the whole
    vocabulary's length where it matches; None where no prefix does). Tokens are only
    ever appended (``tokens._vocab``), so a checkpoint trained on a prefix knows every
    id it learned: only the tokens after it are new to it."""
    for n in range(len(VOCAB), 0, -1):
        if vocab_hash(VOCAB[:n]) == digest:
            return n
    return None


# The vocabulary's length when the initial weights were last drawn whole (before sm90tma
# v5's tokens). Tokens appended after it draw their initial rows from a generator of their
# own, after every other weight, so appending tokens changes no other initial weight: a
# model built from the same seed starts where it did, and training on a corpus that never
# allows the new tokens (their logits masked, so no gradient reaches the rest through them)
# runs as it did.
INIT_VOCAB = 377


def build_model(cfg: ModelConfig) -> Any:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(cfg.seed)
    hf = GPT2Config(
        vocab_size=min(INIT_VOCAB, len(VOCAB)),
        n_positions=cfg.n_positions,
        n_embd=cfg.n_embd,
        n_layer=cfg.n_layer,
        n_head=cfg.n_head,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=1,
        eos_token_id=1,
        pad_token_id=0,
    )
    model = GPT2LMHeadModel(hf)
    if len(VOCAB) > INIT_VOCAB:
        gen = torch.Generator().manual_seed(cfg.seed)
        rows = torch.empty(len(VOCAB) - INIT_VOCAB, cfg.n_embd)
        rows.normal_(0.0, hf.initializer_range, generator=gen)
        model.resize_token_embeddings(len(VOCAB), mean_resizing=False)
        with torch.no_grad():
            model.transformer.wte.weight[INIT_VOCAB:] = rows
    return model


def save(model: Any, cfg: ModelConfig, path: str | Path, info: dict[str, Any]) -> None:
    """``path``.safetensors (weights) and ``path``.json (config, vocabulary hash, how it
    was trained), each written atomically."""
    from safetensors.torch import save_file

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Tied embeddings share storage; safetensors stores each tensor once.
    state = {k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    meta = {"model": asdict(cfg), "vocab_hash": vocab_hash(), "info": info}
    for suffix, write in (
        (".safetensors", lambda p: save_file(state, p)),
        (".json", lambda p: Path(p).write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")),
    ):
        final = path.with_suffix(suffix)
        fd, tmp = tempfile.mkstemp(dir=final.parent, prefix=final.name, suffix=".tmp")
        os.close(fd)
        try:
            write(tmp)
            os.chmod(tmp, 0o644)
            os.replace(tmp, final)
        except BaseException:
            os.unlink(tmp)
            raise


def load(path: str | Path, lite: bool = False) -> tuple[Any, ModelConfig, dict[str, Any]]:
    """The checkpoint's network, config and training info. ``lite``: the same network as
    ``cudal2.policy.gpt2.GPT2`` (plain torch, no transformers import: what a build
    proposes with), else transformers' ``GPT2LMHeadModel`` (training, adapters)."""
    from safetensors.torch import load_file

    path = Path(path)
    meta_path, weights = path.with_suffix(".json"), path.with_suffix(".safetensors")
    for p in (meta_path, weights):
        if not p.exists():
            raise FileNotFoundError(f"policy checkpoint file {p} does not exist")
    meta = json.loads(meta_path.read_text())
    known = vocab_prefix(meta["vocab_hash"])
    if known is None:
        raise ValueError(
            f"{meta_path}: vocabulary hash {meta['vocab_hash']} differs from this version's "
            f"{vocab_hash()}: the checkpoint was trained with another token set; retrain it"
        )
    cfg = ModelConfig(**meta["model"])
    state = load_file(str(weights))
    wte = "transformer.wte.weight"
    if known < len(VOCAB):
        # Trained before the last tokens were appended (room's, sm90tma v5's): its ids mean
        # what they did; the new tokens get zero embeddings (a logit of 0 wherever a
        # grammar allows one, never where it does not), so it scores and samples every
        # design without them exactly as before. Retrain to learn them (docs/policy.md).
        if wte not in state or state[wte].shape[0] != known:
            raise ValueError(f"{weights}: {wte} does not have the {known} rows its hash names")
        import torch

        pad = torch.zeros(len(VOCAB) - known, state[wte].shape[1], dtype=state[wte].dtype)
        state = {**state, wte: torch.cat([state[wte], pad])}
        meta["info"] = {**meta["info"], "vocab_extended_from": known}
    if lite:
        from cudal2.policy import gpt2

        try:
            return (
                gpt2.from_state(state, cfg.n_positions, cfg.n_layer, cfg.n_head),
                cfg,
                meta["info"],
            )
        except (KeyError, RuntimeError) as e:
            raise ValueError(f"{weights}: {e}") from e
    model = build_model(cfg)
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or [k for k in missing if k != "lm_head.weight"]:
        raise ValueError(f"{weights}: missing {missing}, unexpected {unexpected}")
    model.tie_weights()
    model.eval()
    return model, cfg, meta["info"]


def _step_masks(grammar: Grammar) -> Any:
    """[designs, fields, vocab] bool: the grammar's allowed tokens at each field."""
    import torch

    cached = getattr(grammar, "_mask_tensor", None)
    if cached is not None:
        return cached
    masks = torch.zeros(len(grammar.seqs), grammar.fields, len(VOCAB), dtype=torch.bool)
    for i, steps in enumerate(grammar.masks()):
        for j, allowed in enumerate(steps):
            masks[i, j, allowed] = True
    grammar._mask_tensor = masks
    return masks


def _prefix_cache(model: Any, prompt: Sequence[int], batch: int) -> tuple[Any, Any]:
    """The prompt run once: (its last position's logits, its key/value cache repeated
    for ``batch`` continuations). Differentiable."""
    import torch

    from cudal2.policy import gpt2

    if isinstance(model, gpt2.GPT2):
        cache = gpt2.Cache()
    else:
        from transformers import DynamicCache

        cache = DynamicCache()
    out = model(
        input_ids=torch.tensor([list(prompt)], dtype=torch.long),
        past_key_values=cache,
        use_cache=True,
    )
    cache = out.past_key_values
    cache.batch_repeat_interleave(batch)
    return out.logits[:, -1:, :].expand(batch, -1, -1), cache


def score(model: Any, prompt: Sequence[int], grammar: Grammar, chunk: int = 512) -> Any:
    """log p(design | prompt) of every design of ``grammar`` (a [designs] tensor), each
    field's distribution masked to the grammar: the probability that field-by-field
    sampling under the same grammar draws it. Differentiable. The prompt is run once
    per chunk and its cache shared by the chunk's designs."""
    import torch

    seqs = torch.tensor(grammar.seqs, dtype=torch.long)
    masks = _step_masks(grammar)
    out = []
    for lo in range(0, len(seqs), chunk):
        s = seqs[lo : lo + chunk]
        first, cache = _prefix_cache(model, prompt, len(s))
        rest = model(input_ids=s[:, :-1], past_key_values=cache).logits
        logits = torch.cat([first, rest], dim=1)  # position i predicts field i
        logits = logits.masked_fill(~masks[lo : lo + chunk], float("-inf"))
        logp = torch.log_softmax(logits.float(), dim=-1).gather(-1, s.unsqueeze(-1))
        out.append(logp.squeeze(-1).sum(-1))
    return torch.cat(out)


def sample(
    model: Any, prompt: Sequence[int], grammar: Grammar, n: int, generator: Any = None
) -> list[int]:
    """``n`` draws (indices into ``grammar.designs``), decoded field by field with the
    grammar's mask at each field, so every draw is one of its designs."""
    import torch

    index = {tuple(s): i for i, s in enumerate(grammar.seqs)}
    fields: list[list[int]] = [[] for _ in range(n)]
    with torch.no_grad():
        logits, cache = _prefix_cache(model, prompt, n)
        logits = logits[:, -1, :]
        for _ in range(grammar.fields):  # the grammar's padded length (tokens.Grammar)
            mask = torch.zeros_like(logits, dtype=torch.bool)
            for row in range(n):
                mask[row, grammar.allowed(fields[row])] = True
            probs = torch.softmax(logits.float().masked_fill(~mask, float("-inf")), dim=-1)
            nxt = torch.multinomial(probs, 1, generator=generator)
            for row, t in enumerate(nxt[:, 0].tolist()):
                fields[row].append(t)
            logits = model(input_ids=nxt, past_key_values=cache).logits[:, -1, :]
    return [index[tuple(f)] for f in fields]
