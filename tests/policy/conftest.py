"""Policy fixtures, from real H100 measurements: the committed corpus, and a small corpus
collected from the default manifest's recorded database with two of its targets held out."""

from __future__ import annotations

import pytest

from cudal2.manifest import default_manifest_path
from cudal2.policy.corpus import collect, load
from cudal2.policy.learned import DEFAULT_CORPUS
from cudal2.records import Target

DEFAULT_DB = default_manifest_path().with_name("default.measurements.jsonl")
SMALL_HOLDOUT = (
    Target("sm_90a", "fp16", "tn", 64, 4096, 4096),
    Target("sm_90a", "bf16", "nn", 256, 4096, 4096),
)


@pytest.fixture(scope="session")
def committed_corpus():
    return load(DEFAULT_CORPUS)


@pytest.fixture(scope="session")
def small_corpus():
    return collect([DEFAULT_DB], SMALL_HOLDOUT)


@pytest.fixture(scope="session")
def tiny_model_config():
    from cudal2.policy.model import ModelConfig

    return ModelConfig(n_embd=32, n_layer=1, n_head=2, max_history=4, seed=3)
