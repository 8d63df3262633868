"""``patch_model(..., rope_kv=True)`` without a GPU: tiny random Llama, Mistral and Qwen2
(its qkv bias) models generating with transformers' static cache, patched through a
generated package (the recorded table has no entry for these shapes: every fused op runs
its torch fallback, ``linear_rope_kv``'s the reference), against the same model unpatched:
the same tokens, the per-step logits and every layer's cache contents (keys and values,
every slot) within the fp32 bound of tests/packaging/runtime/test_models_cpu.py, and the
qkv op with RoPE and the cache write called once per layer per decode step (the prefill
allocates the cache: the layer's other path). ``drop`` unfolds the packed RoPE rows back;
the other families are refused."""

from __future__ import annotations

import pytest
import torch
import transformers as T

from .test_models_cpu import FP32_REL, FUSED, ids, snapshot, tiny

ROPE_FAMILIES = ["llama", "mistral", "qwen2"]
STEPS = 6


def _generate(model, x):
    cache = T.StaticCache(config=model.config, max_cache_len=16)
    with torch.no_grad():
        out = model.generate(
            x, max_new_tokens=STEPS, min_new_tokens=STEPS, do_sample=False,
            cache=cache, return_dict_in_generate=True, output_logits=True,
        )  # fmt: skip
    return out.sequences, torch.stack(out.logits).float(), cache


@pytest.mark.parametrize(
    ("family", "config"),
    # Mistral without a sliding window (with one, its cache layers slide: the other path)
    [("llama", {}), ("mistral", {"sliding_window": None}), ("qwen2", {}),
     ("mistral", {"sliding_window": 8})],
    ids=["llama", "mistral", "qwen2", "mistral-sliding"],
)  # fmt: skip
def test_generate_with_rope_kv_matches_the_unpatched_model(package, family, config, monkeypatch):
    model = tiny(family, **config)
    x = ids(3, batch=2, tokens=5)
    want_ids, want_logits, want_cache = _generate(model, x)
    calls = []
    api = package._api
    real = api.linear_rope_kv

    def spy(*args):
        calls.append(args[0].shape)
        return real(*args)

    monkeypatch.setattr(api, "linear_rope_kv", spy)
    with package.patch_model(model, rope_kv=True, **FUSED):
        got_ids, got_logits, got_cache = _generate(model, x)
    assert torch.equal(got_ids, want_ids)
    scale = want_logits.abs().max().item()
    assert (got_logits - want_logits).abs().max().item() <= FP32_REL * scale
    # every decode step after the prefill, every layer: one token of each of 2 rows (a
    # sliding cache: none, its layers are not StaticLayer)
    steps = 0 if config.get("sliding_window") else STEPS - 1
    assert calls == [(2, 1, model.config.hidden_size)] * (steps * 2)
    for i, (a, b) in enumerate(zip(got_cache.layers, want_cache.layers, strict=True)):
        for name in ("keys", "values"):
            w, g = getattr(b, name), getattr(a, name)
            assert int(a.cumulative_length) == int(b.cumulative_length), i
            assert (g - w).abs().max().item() <= FP32_REL * w.abs().max().item(), (i, name)


def test_without_rope_kv_the_op_is_never_called(package, monkeypatch):
    model = tiny("llama")
    calls = []
    monkeypatch.setattr(package._api, "linear_rope_kv", lambda *a: calls.append(a))
    with package.patch_model(model, **FUSED):
        _generate(model, ids(3, batch=2, tokens=5))
    assert calls == []


def test_a_broken_rotation_fails(package, monkeypatch):
    """The reference with RoPE's sign flipped: the patched model's logits move."""
    from importlib import import_module

    model = tiny("llama")
    x = ids(3, batch=2, tokens=5)
    _, want_logits, _ = _generate(model, x)
    rk = import_module(package.__name__ + "._runtime.rope_kv")
    real = rk.rotated
    monkeypatch.setattr(rk, "rotated", lambda y, c, s, h: real(y, c, -s, h))
    with package.patch_model(model, rope_kv=True, **FUSED):
        _, got_logits, _ = _generate(model, x)
    scale = want_logits.abs().max().item()
    assert (got_logits - want_logits).abs().max().item() > FP32_REL * scale


def test_drop_unfolds_the_packed_rope_rows(package):
    model = tiny("qwen2", torch.bfloat16)
    tensors, _, _ = snapshot(model)
    patch = package.patch_model(model, originals="drop", rope_kv=True)
    patch.restore()
    now = model.state_dict()
    for name, (t, _) in tensors.items():
        assert torch.allclose(now[name].float(), t.float(), rtol=2**-7, atol=0), name


@pytest.mark.parametrize("family", ["gemma", "phi3"])
def test_other_families_are_refused(package, family):
    with pytest.raises(ValueError, match="rope_kv=True"):
        package.patch_model(tiny(family), rope_kv=True)
