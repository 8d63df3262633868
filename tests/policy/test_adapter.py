"""Per-GPU LoRA adapters: trained on one GPU model's corpus, saved and loaded by peft."""

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from cudal2.generator import design_space
from cudal2.policy import model as pm
from cudal2.policy.adapter import load_with_adapter, merge_lora, save_adapter, train_adapter
from cudal2.policy.learned import DATA, adapter_for
from cudal2.policy.tokens import GpuFeatures, Grammar, prompt_tokens
from cudal2.policy.train import TrainConfig

from .conftest import SMALL_HOLDOUT

H100 = GpuFeatures()


def _scores(model, gpu=H100):
    g = Grammar(design_space("sm_90a", "fp16", "tn")[::50])
    with torch.no_grad():
        return pm.score(model, prompt_tokens(gpu, SMALL_HOLDOUT[0], [], 4), g)


def test_adapter_trains_only_low_rank_weights_and_round_trips(
    small_corpus, tiny_model_config, tmp_path
):
    base = tmp_path / "base"
    pm.save(pm.build_model(tiny_model_config).eval(), tiny_model_config, base, {})
    cfg = TrainConfig(bc_steps=4, grpo_steps=2, batch=2, pool=16, bc_lr=5e-2, seed=4)
    model, mcfg, info = train_adapter(base, small_corpus, cfg, log=lambda s: None)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    assert info["train_targets"] and set(info["holdout_targets"]) == {
        t.label for t in SMALL_HOLDOUT
    }
    save_adapter(model, tmp_path / "lora", info)
    assert json.loads((tmp_path / "lora" / "cudal2_adapter.json").read_text())["gpu"] == info["gpu"]
    again, _ = load_with_adapter(base, tmp_path / "lora")
    plain, _, _ = pm.load(base)
    assert torch.allclose(_scores(again), _scores(model), atol=1e-5)
    assert not torch.allclose(_scores(again), _scores(plain), atol=1e-4)  # the adapter acts
    with pytest.raises(FileNotFoundError, match="adapter_config.json"):
        load_with_adapter(base, tmp_path)


@pytest.mark.parametrize("gpu", ["h100", "h200"])
def test_committed_adapters_load_on_the_committed_base(gpu):
    folder = DATA / f"{gpu}-lora"
    info = json.loads((folder / "cudal2_adapter.json").read_text())
    assert info["gpu"].startswith(f"NVIDIA {gpu.upper()}")
    assert len(info["train_targets"]) == 6 and len(info["holdout_targets"]) == 6
    assert not set(info["train_targets"]) & set(info["holdout_targets"])
    model, _ = load_with_adapter(DATA / "h100-policy", folder)
    base, _, _ = pm.load(DATA / "h100-policy")
    h200 = dataclasses.replace(GpuFeatures(), bandwidth=4.8e12)
    assert not torch.allclose(_scores(model, h200), _scores(base, h200), atol=1e-4)


@pytest.mark.parametrize("gpu", ["h100", "h200"])
def test_merging_an_adapter_without_peft_matches_peft(gpu):
    folder = DATA / f"{gpu}-lora"
    merged, _, _ = pm.load(DATA / "h100-policy")
    merge_lora(merged, folder)
    with_peft, _ = load_with_adapter(DATA / "h100-policy", folder)
    assert torch.allclose(_scores(merged), _scores(with_peft), atol=1e-4)


def test_merging_refuses_adapters_it_cannot_merge(tmp_path):
    import shutil

    folder = tmp_path / "dora"
    shutil.copytree(DATA / "h100-lora", folder)
    cfg = json.loads((folder / "adapter_config.json").read_text())
    (folder / "adapter_config.json").write_text(json.dumps({**cfg, "use_dora": True}))
    model, _, _ = pm.load(DATA / "h100-policy")
    with pytest.raises(ValueError, match="use_dora=True"):
        merge_lora(model, folder)
    (folder / "adapter_model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="no adapter_model.safetensors"):
        merge_lora(model, folder)


def test_a_build_takes_the_measuring_gpus_adapter():
    assert adapter_for("NVIDIA H200", DATA / "h100-policy") == DATA / "h200-lora"
    assert adapter_for("NVIDIA H100 80GB HBM3", DATA / "h100-policy") == DATA / "h100-lora"
    assert adapter_for("NVIDIA A100-SXM4-80GB", DATA / "h100-policy") is None
    assert adapter_for("NVIDIA H200", DATA / "other-policy") is None  # trained on another base


@pytest.mark.parametrize(
    "change, needle",
    [
        ({"base_vocab_hash": "0" * 16}, "trained for vocabulary"),
        ({"base_sha256": "0" * 64}, "trained on another base"),
        ({"base_vocab_hash": None}, "trained for vocabulary None"),
    ],
)
def test_an_adapter_of_another_base_is_refused(tmp_path, change, needle):
    """An adapter is a delta of one base checkpoint under one vocabulary: merged onto
    another it would silently give other weights."""
    import shutil

    folder = tmp_path / "lora"
    shutil.copytree(DATA / "h100-lora", folder)
    meta = json.loads((folder / "cudal2_adapter.json").read_text())
    (folder / "cudal2_adapter.json").write_text(json.dumps({**meta, **change}))
    model, _, _ = pm.load(DATA / "h100-policy")
    with pytest.raises(ValueError, match=needle):
        merge_lora(model, folder, DATA / "h100-policy")
    with pytest.raises(ValueError, match=needle):
        load_with_adapter(DATA / "h100-policy", folder)


class _FakePeft:
    """What ``save_adapter`` asks of a peft model: ``save_pretrained(folder)``."""

    def __init__(self, weights: bytes, fail: bool = False):
        self.weights, self.fail = weights, fail

    def save_pretrained(self, folder: str) -> None:
        (Path(folder) / "adapter_config.json").write_text("{}")
        if self.fail:
            raise OSError("disk full")
        (Path(folder) / "adapter_model.safetensors").write_bytes(self.weights)


def test_save_adapter_replaces_the_folder_whole(tmp_path):
    """An adapter folder is written under a temporary name and renamed into place: a
    second save replaces the first whole, a failing one leaves it as it was, and no
    temporary folder stays behind."""
    out = tmp_path / "lora"
    save_adapter(_FakePeft(b"one"), out, {"gpu": "a"})
    save_adapter(_FakePeft(b"two"), out, {"gpu": "b"})
    assert (out / "adapter_model.safetensors").read_bytes() == b"two"
    assert json.loads((out / "cudal2_adapter.json").read_text()) == {"gpu": "b"}
    with pytest.raises(OSError, match="disk full"):
        save_adapter(_FakePeft(b"three", fail=True), out, {"gpu": "c"})
    assert (out / "adapter_model.safetensors").read_bytes() == b"two"
    assert json.loads((out / "cudal2_adapter.json").read_text()) == {"gpu": "b"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lora"]
    assert oct(out.stat().st_mode & 0o777) == "0o755"
