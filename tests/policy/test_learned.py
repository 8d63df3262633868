"""The committed checkpoint as a build's proposer."""

import dataclasses

import pytest

from cudal2.generator import legality
from cudal2.policy import make_proposer
from cudal2.policy.learned import DEFAULT_CHECKPOINT, row_of
from cudal2.records import Target

NEW = Target("sm_90a", "fp16", "tn", 24, 6144, 5120)  # in no manifest


def test_committed_checkpoint_proposes_new_legal_designs(recorded_measurements):
    assert DEFAULT_CHECKPOINT.with_suffix(".safetensors").exists()
    p = make_proposer("policy", 0)
    first = p.propose(NEW, [], 16)
    assert len(first) == 16 == len(set(first))
    assert all(not legality(d) and (d.dtype, d.layout) == ("fp16", "tn") for d in first)
    assert p.propose(NEW, [], 16) == first  # seeded: the same build proposes the same
    # a measured design is never proposed again: fake this build's history by moving
    # real recorded measurements onto the new target with the first round's designs
    fp16 = [m for m in recorded_measurements if m.design and m.target.dtype == "fp16"]
    history = [
        dataclasses.replace(m, target=NEW, design=d, design_key=d.key)
        for m, d in zip(fp16, first, strict=False)
    ]
    second = p.propose(NEW, history, 16)
    assert len(second) == 16 and not {d.key for d in second} & {m.design_key for m in history}
    assert row_of(history[0]).speedup == history[0].baselines_us["torch"] / history[0].median_us


def test_families_restrict_the_policy():
    ds = make_proposer("policy", 1, ("sm90direct",)).propose(NEW, [], 8)
    assert len(ds) == 8 and {d.family for d in ds} == {"sm90direct"}


def test_the_policy_samples_on_one_thread_and_gives_the_threads_back(monkeypatch):
    """Sampling runs with torch's intra-op threads at ``PROPOSE_THREADS`` (in a build, 16
    compiles run beside it) and leaves them as they were, however it ends."""
    import pytest
    import torch

    from cudal2.policy import learned
    from cudal2.policy import model as pm

    seen = []
    real = pm.sample

    def sample(*a, **kw):
        seen.append(torch.get_num_threads())
        return real(*a, **kw)

    monkeypatch.setattr(pm, "sample", sample)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        p = make_proposer("policy", 0)
        assert len(p.propose(NEW, [], 8)) == 8
        assert seen == [learned.PROPOSE_THREADS] and torch.get_num_threads() == 2

        def broken(*a, **kw):
            raise RuntimeError("sampling failed")

        monkeypatch.setattr(pm, "sample", broken)
        with pytest.raises(RuntimeError, match="sampling failed"):
            p.propose(Target("sm_90a", "fp16", "tn", 40, 6144, 5120), [], 8)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_the_legal_space_is_found_once_per_kind_of_target(monkeypatch):
    """Without a given space, one search space (and grammar) per (arch, dtype, layout,
    epilogue): a proposal for another target of that kind does not enumerate or hash the
    space's designs again."""
    from cudal2.policy import learned

    calls = []
    real = learned.search_space
    monkeypatch.setattr(learned, "search_space", lambda t, *a: calls.append(t) or real(t, *a))
    p = learned.PolicyProposer(0, ("sm90direct",))
    assert p.propose(NEW, [], 2) and p.propose(dataclasses.replace(NEW, m=NEW.m + 7), [], 2)
    assert len(calls) == 1
    assert p.propose(dataclasses.replace(NEW, dtype="bf16"), [], 2) and len(calls) == 2


@pytest.mark.parametrize("child", ["enumerates", "fails"])
def test_load_enumerates_the_targets_spaces_in_a_child_and_proposes_the_same(monkeypatch, child):
    """``load(targets)`` has a child process enumerate the legal spaces of the targets'
    kinds while the weights load: the proposals are those of a proposer that enumerated
    them itself, and the build's process enumerates none (a child that fails: it does)."""
    from cudal2.policy import learned

    targets = [NEW, dataclasses.replace(NEW, m=4096)]
    plain = learned.PolicyProposer(0, ("sm90direct", "sm90tma"))
    want = [plain.propose(t, [], 4) for t in targets]
    if child == "fails":
        monkeypatch.setattr(learned.sys, "executable", "/nonexistent/python")
    calls = []
    real = learned.search_space
    monkeypatch.setattr(learned, "search_space", lambda t, *a: calls.append(t) or real(t, *a))
    warmed = learned.PolicyProposer(0, ("sm90direct", "sm90tma"))
    warmed.load(targets)
    assert [warmed.propose(t, [], 4) for t in targets] == want
    assert len(calls) == (0 if child == "enumerates" else 1)
