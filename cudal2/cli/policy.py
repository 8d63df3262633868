"""``cudal2-policy``: the learned proposer's corpus, training and replay evaluation.

    cudal2-policy corpus --db A.jsonl [B.jsonl.gz ...] [--holdout MANIFEST ...] --out CORPUS
    cudal2-policy train --db CORPUS [--out CHECKPOINT] [--bc-steps N] [--grpo-steps N]
    cudal2-policy eval --db CORPUS [--checkpoint CHECKPOINT] [--adapter DIR] [--online [LR]]
                       [--json] [--plot PNG]
    cudal2-policy adapt --db GPU_CORPUS [--base CHECKPOINT] --out DIR

Exit status 2 when an input cannot be read (the message names it).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from cudal2.cli import args as cli_args
from cudal2.cli.output import atomic_path, write_text
from cudal2.manifest import ManifestError
from cudal2.policy.corpus import CorpusError
from cudal2.policy.learned import DEFAULT_CHECKPOINT, DEFAULT_CORPUS
from cudal2.policy.online import DEFAULT_ONLINE


def build_parser() -> cli_args.Parser:
    ap = cli_args.Parser(prog="cudal2-policy", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    c = sub.add_parser("corpus", help="collect measurement databases into a corpus")
    c.add_argument(
        "--db",
        nargs="+",
        type=cli_args.in_file,
        required=True,
        help="measurement databases (.jsonl[.gz])",
    )
    c.add_argument("--holdout", nargs="*", default=[], help="manifests whose targets are held out")
    c.add_argument("--gpu", default="NVIDIA H100", help="GPU model name prefix to keep")
    c.add_argument("--out", type=cli_args.out_file, required=True)
    t = sub.add_parser("train", help="behaviour cloning, then GRPO, on a corpus's train split")
    t.add_argument("--db", type=cli_args.in_file, default=DEFAULT_CORPUS, help="corpus file")
    t.add_argument(
        "--out",
        type=cli_args.out_prefix,
        default=DEFAULT_CHECKPOINT,
        help="checkpoint path (no suffix)",
    )
    t.add_argument("--bc-steps", type=cli_args.non_negative_int)
    t.add_argument("--grpo-steps", type=cli_args.non_negative_int)
    t.add_argument("--seed", type=cli_args.seed, default=0)
    t.add_argument(
        "--restriction",
        choices=("grammar", "condition"),
        default="grammar",
        help="how pools restrict the policy in training (docs/policy.md)",
    )
    e = sub.add_parser("eval", help="replay the held-out targets: policy vs random vs grid")
    e.add_argument("--db", type=cli_args.in_file, default=DEFAULT_CORPUS, help="corpus file")
    e.add_argument("--checkpoint", default=str(DEFAULT_CHECKPOINT))
    e.add_argument(
        "--adapter",
        type=cli_args.in_dir,
        help="a peft LoRA adapter folder to apply to the checkpoint",
    )
    e.add_argument(
        "--restriction",
        choices=("condition", "grammar"),
        default="condition",
        help="how the policy is restricted to the measured designs (docs/policy.md)",
    )
    e.add_argument(
        "--online",
        nargs="?",
        type=cli_args.positive_float,
        const=DEFAULT_ONLINE.lr,
        metavar="LR",
        help="update the policy's weights between rounds, as a build does "
        f"(learning rate; {DEFAULT_ONLINE.lr} if given bare)",
    )
    e.add_argument("--policy-seeds", type=cli_args.positive_int, default=5)
    e.add_argument("--random-seeds", type=cli_args.positive_int, default=20)
    e.add_argument("--json", action="store_true", help="print the summary as JSON")
    e.add_argument(
        "--out", type=cli_args.out_file, help="also write the full result (per target) as JSON here"
    )
    e.add_argument(
        "--plot", type=cli_args.out_file, help="write the curves (median ratio vs k) to this PNG"
    )
    a = sub.add_parser("adapt", help="train a LoRA adapter for one GPU model's corpus")
    a.add_argument(
        "--db", type=cli_args.in_file, required=True, help="corpus of one GPU model's measurements"
    )
    a.add_argument("--base", default=str(DEFAULT_CHECKPOINT), help="base checkpoint")
    a.add_argument("--out", type=cli_args.out_folder, required=True, help="adapter folder")
    a.add_argument("--seed", type=cli_args.seed, default=0)
    return ap


def _adapt(args: argparse.Namespace) -> int:
    import dataclasses

    from cudal2.policy.adapter import ADAPTER_TRAIN, save_adapter, train_adapter
    from cudal2.policy.corpus import load

    corpus = load(args.db)
    cfg = dataclasses.replace(ADAPTER_TRAIN, seed=args.seed)
    model, _, info = train_adapter(args.base, corpus, cfg, log=lambda s: print(s, flush=True))
    info["corpus"] = Path(args.db).name
    save_adapter(model, args.out, info)
    print(f"adapter: {args.out} ({info['seconds']} s, {corpus.gpu})")
    return 0


def _corpus(args: argparse.Namespace) -> int:
    from cudal2.manifest import load_manifest
    from cudal2.policy.corpus import collect, write

    holdout = [t for m in args.holdout for t in load_manifest(m).targets]
    corpus = collect(args.db, holdout, args.gpu)
    if not corpus.rows:
        raise CorpusError(f"no kernel records measured on {args.gpu!r} in {args.db}")
    write(corpus, args.out)
    by = corpus.by_target()
    print(
        f"{args.out}: {len(corpus.rows)} measurements, {len(by)} targets "
        f"({len(corpus.targets('holdout'))} held out), {corpus.gpu}; "
        f"{sum(r.status != 'ok' for r in corpus.rows)} failures; "
        f"{corpus.dropped_illegal} records of designs no longer legal left out"
    )
    return 0


def _train(args: argparse.Namespace) -> int:
    import dataclasses

    from cudal2.policy import model as pm
    from cudal2.policy.corpus import load
    from cudal2.policy.train import TrainConfig, train

    corpus = load(args.db)
    over = {"seed": args.seed, "restriction": args.restriction}
    if args.bc_steps is not None:
        over["bc_steps"] = args.bc_steps
    if args.grpo_steps is not None:
        over["grpo_steps"] = args.grpo_steps
    cfg = dataclasses.replace(TrainConfig(), **over)
    mcfg = pm.ModelConfig(seed=args.seed)
    model, info = train(corpus, cfg, mcfg, log=lambda s: print(s, flush=True))
    info["corpus"] = Path(args.db).name
    pm.save(model, mcfg, args.out, info)
    print(f"checkpoint: {args.out}.safetensors, {args.out}.json ({info['seconds']['total']} s)")
    return 0


def _eval(args: argparse.Namespace) -> int:
    import dataclasses

    from cudal2.policy import model as pm
    from cudal2.policy.corpus import load
    from cudal2.policy.evaluate import KS, evaluate

    corpus = load(args.db)
    if not corpus.targets("holdout"):
        raise CorpusError(f"{args.db}: no held-out targets to evaluate on")
    if args.adapter:
        from cudal2.policy.adapter import load_with_adapter

        model, mcfg = load_with_adapter(args.checkpoint, args.adapter)
    else:
        model, mcfg, _ = pm.load(args.checkpoint)
    quiet = args.json
    res = evaluate(
        corpus,
        model,
        mcfg,
        args.policy_seeds,
        args.random_seeds,
        progress=(lambda s: None) if quiet else (lambda s: print(s, file=sys.stderr, flush=True)),
        restriction=args.restriction,
        online=None if args.online is None else dataclasses.replace(DEFAULT_ONLINE, lr=args.online),
        bar=not quiet,
    )
    # No sort_keys: k keys are strings in JSON, and "10" < "2" as strings; evaluate()
    # builds every k mapping in numeric order (and the rest in a fixed order).
    if args.out:
        write_text(args.out, json.dumps(res, indent=1) + "\n")
    summary = {k: v for k, v in res.items() if k != "per_target"}
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"held-out targets: {res['holdout_targets']}")
        print(f"{'k':>4} {'policy':>8} {'random':>8} {'grid':>8}")
        for k in KS:
            row = res["k"][str(k)]
            print(f"{k:>4} {row['policy']:8.3f} {row['random']:8.3f} {row['grid']:8.3f}")
    if args.plot:
        plot(res, args.plot)
    return 0


def plot(res: dict, path: str | Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = [("all", res)] + sorted(res["by_family"].items())
    fig, axes = plt.subplots(1, len(groups), figsize=(4 * len(groups), 3.6), sharey=True)
    for ax, (title, g) in zip(axes, groups, strict=True):
        ks = sorted(int(k) for k in g["k"])
        for name, style in (("policy", "o-"), ("random", "s--"), ("grid", "^:")):
            ax.plot(ks, [g["k"][str(k)][name] for k in ks], style, label=name)
        n = res["holdout_targets"] if title == "all" else g["targets"]
        ax.set_title(f"{title} ({n} targets)", fontsize=9)
        ax.set_xscale("log", base=2)
        ax.set_xticks(ks, [str(k) for k in ks])
        ax.set_xlabel("proposals k")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("best found / best known (median)")
    axes[0].legend()
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=120)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse(argv)
    if isinstance(args, int):  # a bad command line, already reported
        return args
    try:
        commands = {"corpus": _corpus, "train": _train, "eval": _eval, "adapt": _adapt}
        return commands[args.command](args)
    except (CorpusError, ManifestError, FileNotFoundError, ValueError) as e:
        print(f"cudal2-policy: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
