"""The learned proposer: the trained policy sampling designs for a build.

Each round's prompt holds the GPU, the target, the best and worst designs of the three
nearest targets of the corpus, and what this build measured on the target so far (its
speedups and profile metrics), best last. Designs are decoded field by field under the
legal space's grammar, minus what was measured already, so every proposal is legal and
new. Where the policy's draws repeat, the cost model's grid order fills the round up.

On the GPU a build measures on, the proposer adds that GPU model's LoRA adapter to the
base weights where one is committed (``ADAPTERS``; merged without peft), and gives the
prompt that GPU's features. After each round, ``observe`` updates the weights from the
round's measured rewards (``online.OnlineLearner``; ``updates=False`` keeps them fixed).
``space`` narrows the search to given designs per target (a replay's recorded ones): the
grammar is then that set's, as the replay evaluation's ``grammar`` restriction.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import pickle
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from cudal2.policy.base import Space, measured_designs, search_space
from cudal2.policy.corpus import Row
from cudal2.policy.grid import grid_round
from cudal2.policy.online import DEFAULT_ONLINE, OnlineConfig, OnlineLearner, full_space_logp
from cudal2.policy.reward import reward
from cudal2.policy.tokens import Grammar
from cudal2.records import KernelDesign, Measurement, Target

DATA = Path(__file__).resolve().parent / "data"
DEFAULT_CHECKPOINT = DATA / "h100-policy"
DEFAULT_CORPUS = DATA / "h100-corpus.jsonl.gz"
OVERSAMPLE = 4  # draws per wanted design before the grid fills up
# GPU model name prefix -> the LoRA adapter trained on its measurements (on DEFAULT_CHECKPOINT)
ADAPTERS = {"NVIDIA H100": DATA / "h100-lora", "NVIDIA H200": DATA / "h200-lora"}


def adapter_for(gpu: str | None, checkpoint: Path) -> Path | None:
    """The committed adapter for GPU model ``gpu``, if it was trained on ``checkpoint``."""
    import json

    for prefix, folder in ADAPTERS.items():
        if gpu and gpu.startswith(prefix) and folder.is_dir():
            info = json.loads((folder / "cudal2_adapter.json").read_text())
            return folder if info.get("base") == checkpoint.name else None
    return None


def _enumerate(kind: tuple[str, ...], families: tuple[str, ...] | None) -> list[KernelDesign]:
    """The legal space of targets of ``kind`` (``_kind``)."""
    arch, dtype, layout, epilogue = kind
    return search_space(Target(arch, dtype, layout, 1, 1, 1, epilogue=epilogue), families)


class _Spaces:
    """Legal spaces enumerated in a child process (``python -m cudal2.policy.learned``,
    the kinds and families as JSON on its command line, the spaces pickled on its
    stdout) while the build loads the policy: a plain child, not ``multiprocessing``'s,
    which would import the caller's main module again. ``take(kind)``: that kind's
    designs, once (waiting for the child if need be); None where it was not asked for
    or the child failed, so the caller enumerates it itself (the same designs, in the
    same order)."""

    def __init__(self, child: subprocess.Popen[bytes], kinds: list[tuple[str, ...]]):
        self._child, self._kinds = child, kinds
        self._spaces: dict[tuple[str, ...], list[KernelDesign]] | None = None

    @classmethod
    def start(cls, kinds: set[tuple[str, ...]], families: Sequence[str] | None) -> _Spaces:
        asked = sorted(kinds)
        arg = json.dumps({"kinds": asked, "families": families and list(families)})
        cmd = [sys.executable, "-m", "cudal2.policy.learned", arg]
        child = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        return cls(child, asked)

    def take(self, kind: tuple[str, ...]) -> list[KernelDesign] | None:
        if self._spaces is None:
            out, _ = self._child.communicate()
            spaces = pickle.loads(out) if self._child.returncode == 0 and out else []
            self._spaces = {k: v for k, v in zip(self._kinds, spaces, strict=False) if v}
        return self._spaces.pop(kind, None)


def _main(arg: str) -> None:
    """The child of ``_Spaces``: each asked kind's legal space, pickled on stdout."""
    asked = json.loads(arg)
    fams = tuple(asked["families"]) if asked["families"] is not None else None
    spaces: list[list[KernelDesign] | None] = []
    for k in asked["kinds"]:
        try:
            spaces.append(_enumerate(tuple(k), fams))
        except Exception:  # (a kind this cannot make a target of): the caller's to do
            spaces.append(None)
    sys.stdout.buffer.write(pickle.dumps(spaces, protocol=pickle.HIGHEST_PROTOCOL))


def _kind(target: Target) -> tuple[str, ...]:
    """What the legal space of ``target`` depends on (``policy.base.search_space``
    without a ``space``)."""
    return (target.arch, target.dtype, target.layout, target.epilogue)


def row_of(m: Measurement) -> Row:
    """A build's measurement as a corpus row (for the prompt's history)."""
    if m.design is None:
        raise ValueError("a vendor record has no design to put in a policy's history")
    ok = m.status == "ok"
    return Row(
        target=m.target,
        design=m.design,
        status=m.status,
        time_us=m.median_us if ok else None,
        torch_us=m.baselines_us.get("torch"),
        gpu=m.gpu.name,
        proposer=m.proposer,
        deviation=None,
        metrics={k: float(v) for k, v in m.metrics.items() if isinstance(v, int | float)},
        code_chars=0,
    )


# Intra-op threads while sampling: the model is small, so its ops gain nothing from a
# team of threads, and in a build 16 compiles run beside it: with torch's default (one
# thread per core) each proposal took 0.46 s on the H100's host during a build, and on a
# loaded 2-core machine 2.0 s with 2 threads against 0.12 s with 1 (the llama manifest's
# targets). One thread also makes the samples the same whatever the machine's cores.
PROPOSE_THREADS = 1


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """torch's intra-op threads set to ``n`` inside the block, as they were after it."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class PolicyProposer:
    name = "policy"

    def __init__(
        self,
        seed: int = 0,
        families: Sequence[str] | None = None,
        checkpoint: str | Path = DEFAULT_CHECKPOINT,
        corpus: str | Path = DEFAULT_CORPUS,
        gpu: str | None = None,
        updates: bool = True,
        online: OnlineConfig = DEFAULT_ONLINE,
        space: Space | None = None,
    ):
        self.seed = seed
        self.space = space  # the designs searched per target (None: the legal space)
        self.families = families
        self.checkpoint = Path(checkpoint)
        self.corpus_path = Path(corpus)
        self.gpu = gpu
        self.adapter = adapter_for(gpu, self.checkpoint)
        self.updates = updates
        self.online = online
        self._loaded: tuple[Any, Any, Any, OnlineLearner | None] | None = None
        # per search space (its designs, in order): its grammar and the designs' keys
        self._spaces: dict[tuple[KernelDesign, ...], tuple[Grammar, list[str]]] = {}
        self._kinds: dict[tuple[str, ...], tuple[Grammar, list[str]] | None] = {}
        self._pending: _Spaces | None = None  # legal spaces enumerated by ``load``

    def describe(self) -> str:
        adapter = f" + adapter {self.adapter.name}" if self.adapter else ""
        updates = f", updated between rounds (lr {self.online.lr})" if self.updates else ""
        return f"policy {self.checkpoint.name}{adapter}{updates}"

    def load(self, targets: Sequence[Target] = ()) -> None:
        """Load the weights and the corpus now (else the first ``propose`` does): a
        build times it as a stage of its own. The legal spaces of ``targets``' kinds are
        enumerated meanwhile, in a child process (``_Spaces``), so the first proposal
        does not wait for them after the loading (on a 2-core CPU machine it took 1.2 s,
        not 2.5 s). The child writes them all at once when the first proposal reads
        them; a build that fails before proposing leaves it blocked on its pipe until the
        build's process ends."""
        if self.space is None and targets and self._pending is None:
            try:
                self._pending = _Spaces.start({_kind(t) for t in targets}, self.families)
            except Exception:  # no child process here: the first proposal enumerates
                self._pending = None
        self._load()

    def _load(self) -> tuple[Any, Any, Any, OnlineLearner | None]:
        if self._loaded is None:
            from cudal2.policy import model as pm
            from cudal2.policy.adapter import merge_lora
            from cudal2.policy.corpus import load
            from cudal2.policy.train import Context

            # plain torch: importing transformers' GPT-2 cost a fresh GPU machine ~15 s
            model, mcfg, _ = pm.load(self.checkpoint, lite=True)
            if self.adapter is not None:
                merge_lora(model, self.adapter, self.checkpoint)
            # Every measured target of the corpus may serve as a neighbour in a build.
            ctx = Context(load(self.corpus_path), neighbours="all", gpu=self.gpu)
            learner = OnlineLearner(model, self.online) if self.updates else None
            self._loaded = (model, mcfg, ctx, learner)
        return self._loaded

    def propose(self, target: Target, history: Sequence[Measurement], n: int) -> list[KernelDesign]:
        import torch

        from cudal2.policy import model as pm

        model, mcfg, ctx, learner = self._load()
        seen = measured_designs(target, history)
        found = self._space(target)
        if found is None or n <= 0:
            return []
        space, keys = found
        drop = [i for i, k in enumerate(keys) if k in seen]
        if len(drop) == len(keys):
            return []
        own = [row_of(m) for m in history if m.target == target and m.design is not None]
        prompt = ctx.prompt(target, own, mcfg.max_history)
        # the space's grammar minus what was measured: what Grammar(left) would build
        grammar = space.without(drop) if drop else space
        left = grammar.designs
        digest = hashlib.sha256(f"{self.seed}:{target.key}:{len(seen)}".encode()).hexdigest()
        gen = torch.Generator().manual_seed(int(digest[:15], 16))
        with torch_threads(PROPOSE_THREADS):
            draws = pm.sample(model, prompt, grammar, min(len(left), OVERSAMPLE * n), gen)
            picked = list(dict.fromkeys(grammar.designs[i] for i in draws))[:n]
            if learner is not None:
                learner.expect(target, full_space_logp(prompt, grammar.view(picked)), picked)
        if len(picked) < n:
            chosen = set(picked)
            picked += grid_round(target, [d for d in left if d not in chosen], n - len(picked))
        return picked

    def _space(self, target: Target) -> tuple[Grammar, list[str]] | None:
        """The grammar of ``target``'s search space and its designs' keys, built once per
        space: tokenising and keying a legal space of thousands of designs cost more than
        sampling from it, and a build asks for it for every target and round. None: an
        empty space."""
        # Without a ``space``, the legal space is one per (arch, dtype, layout, epilogue):
        # found by that, not by hashing its thousands of designs at every proposal.
        kind = None if self.space is not None else _kind(target)
        if kind is not None and kind in self._kinds:
            return self._kinds[kind]
        enumerated = self._pending.take(kind) if self._pending and kind else None
        if enumerated is None:
            enumerated = search_space(target, self.families, self.space)
        designs = tuple(dict.fromkeys(enumerated))
        found = self._spaces.get(designs)
        if found is None and designs:
            found = (Grammar(designs), [d.key for d in designs])
            self._spaces[designs] = found
        if kind is not None:
            self._kinds[kind] = found
        return found

    def observe(self, measurements: Sequence[Measurement]) -> str | None:
        """The round's rewards (speedup over torch in the same process; failures
        ``reward.FAILURE``) update the weights; the next prompt also carries them."""
        if self._loaded is None or self._loaded[3] is None:
            return None
        rewards: dict[Target, dict[KernelDesign, float]] = {}
        for m in measurements:
            if m.design is not None:
                rewards.setdefault(m.target, {})[m.design] = reward(row_of(m), 0.0)
        done = self._loaded[3].update(rewards)
        return f"policy: weights updated from {done['groups']} targets' rounds"


if __name__ == "__main__":
    _main(sys.argv[1])
