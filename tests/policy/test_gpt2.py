"""The build's plain-torch GPT-2 (``cudal2.policy.gpt2``) against transformers'
``GPT2LMHeadModel`` on the committed checkpoints: logits through every path the
proposer takes (the prompt, the cache repeated per draw, one step, several steps),
``score`` and its gradients, all bit for bit; and a build's proposer never imports
transformers."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from cudal2.generator import design_space
from cudal2.policy import model as pm
from cudal2.policy.adapter import merge_lora
from cudal2.policy.learned import ADAPTERS, DEFAULT_CHECKPOINT
from cudal2.policy.tokens import Grammar

pytest.importorskip("transformers")


def _pair(adapter: bool) -> tuple[torch.nn.Module, torch.nn.Module]:
    hf, _, _ = pm.load(DEFAULT_CHECKPOINT)
    lite, _, _ = pm.load(DEFAULT_CHECKPOINT, lite=True)
    if adapter:
        lora = ADAPTERS["NVIDIA H100"]
        merge_lora(hf, lora, DEFAULT_CHECKPOINT)
        merge_lora(lite, lora, DEFAULT_CHECKPOINT)
    return hf, lite


def _paths(model: torch.nn.Module, prompt: torch.Tensor, vocab: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    first, cache = pm._prefix_cache(model, prompt.tolist(), 5)
    one = model(input_ids=torch.randint(0, vocab, (5, 1), generator=gen), past_key_values=cache)
    more = model(input_ids=torch.randint(0, vocab, (5, 9), generator=gen), past_key_values=cache)
    return [first, one.logits, more.logits]


@pytest.mark.parametrize("adapter", [False, True], ids=["base", "h100-lora"])
@pytest.mark.parametrize("length", [1, 57, 200])
def test_logits_equal_transformers_bit_for_bit(adapter: bool, length: int) -> None:
    hf, lite = _pair(adapter)
    vocab = lite.transformer.wte.weight.shape[0]
    prompt = torch.randint(0, vocab, (length,), generator=torch.Generator().manual_seed(length))
    with torch.no_grad():
        for ours, theirs in zip(
            _paths(lite, prompt, vocab), _paths(hf, prompt, vocab), strict=True
        ):
            assert ours.shape == theirs.shape
            assert torch.equal(ours, theirs)


def test_score_and_its_gradients_equal_transformers_bit_for_bit() -> None:
    hf, lite = _pair(adapter=True)
    grammar = Grammar(design_space("sm_90a", "fp16", "tn")[:300])
    prompt = list(range(2, 40))
    ours, theirs = pm.score(lite, prompt, grammar), pm.score(hf, prompt, grammar)
    assert torch.equal(ours, theirs)
    ours.sum().backward()
    theirs.sum().backward()
    grads = dict(hf.named_parameters())
    for name, p in lite.named_parameters():
        assert torch.equal(p.grad, grads[name].grad), name


def test_sampling_draws_what_transformers_draws() -> None:
    hf, lite = _pair(adapter=True)
    grammar = Grammar(design_space("sm_90a", "fp16", "tn"))
    draws = [
        pm.sample(m, list(range(2, 30)), grammar, 24, torch.Generator().manual_seed(7))
        for m in (lite, hf)
    ]
    assert draws[0] == draws[1]


# A state dict that is not the checkpoint's network: each is refused naming the file.
BAD_STATES = [
    ("a missing layer norm", lambda s: {k: v for k, v in s.items() if "ln_f.bias" not in k}),
    ("an unknown tensor", lambda s: {**s, "transformer.extra": torch.zeros(1)}),
    (
        "a wrong shape",
        lambda s: {**s, "transformer.wpe.weight": s["transformer.wpe.weight"][:, :64]},
    ),
]


@pytest.mark.parametrize(("what", "spoil"), BAD_STATES, ids=[b[0] for b in BAD_STATES])
def test_a_state_that_does_not_fit_is_refused(tmp_path: Path, what, spoil, monkeypatch) -> None:
    from safetensors import torch as st

    real = st.load_file
    monkeypatch.setattr(st, "load_file", lambda path: spoil(real(path)))
    with pytest.raises(ValueError, match="h100-policy.safetensors"):
        pm.load(DEFAULT_CHECKPOINT, lite=True)


def test_a_build_proposer_imports_no_transformers() -> None:
    code = (
        "import sys\n"
        "from cudal2.policy import make_proposer\n"
        "from cudal2.records import Target\n"
        "p = make_proposer('policy', 0, None, gpu='NVIDIA H100 80GB HBM3', updates=True)\n"
        "p.load()\n"
        "assert p.propose(Target('sm_90a', 'fp16', 'tn', 16, 4096, 4096), [], 4)\n"
        "print('transformers' in sys.modules, 'peft' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]
