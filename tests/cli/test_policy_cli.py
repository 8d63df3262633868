import json

from cudal2.cli import policy as policy_cli
from cudal2.manifest import default_manifest_path

DB = default_manifest_path().with_name("default.measurements.jsonl")


def test_corpus_train_eval_end_to_end(tmp_path, capsys):
    holdout = tmp_path / "holdout.toml"
    holdout.write_text(
        '[package]\nname = "h"\nversion = "0.1.0"\n[build]\ndtypes = ["fp16"]\n'
        "[[targets]]\nshapes = [[64, 4096, 4096], [1024, 4096, 4096]]\n"
    )
    corpus = tmp_path / "c.jsonl.gz"
    assert (
        policy_cli.main(
            ["corpus", "--db", str(DB), "--holdout", str(holdout), "--out", str(corpus)]
        )
        == 0
    )
    assert "(2 held out)" in capsys.readouterr().out
    ck = tmp_path / "ck"
    args = ["train", "--db", str(corpus), "--out", str(ck), "--bc-steps", "2", "--grpo-steps", "1"]
    assert policy_cli.main(args) == 0
    assert ck.with_suffix(".safetensors").exists() and ck.with_suffix(".json").exists()
    capsys.readouterr()
    out = tmp_path / "full.json"
    args = ["eval", "--db", str(corpus), "--checkpoint", str(ck), "--json", "--policy-seeds", "1"]
    assert policy_cli.main([*args, "--random-seeds", "5", "--out", str(out)]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["holdout_targets"] == 2
    assert list(summary["k"]) == ["8", "16", "32", "64"]  # numeric, not "16" < "8"
    assert list(json.loads(out.read_text())["k"]) == ["8", "16", "32", "64"]
    assert set(summary["k"]["16"]) == {"policy", "random", "grid"}
    assert len(json.loads(out.read_text())["per_target"]) == 2
    png = tmp_path / "curves.png"
    assert policy_cli.main([*args, "--random-seeds", "5", "--plot", str(png)]) == 0
    assert png.read_bytes()[:4] == b"\x89PNG"
    capsys.readouterr()
    # Not --json: progress on stderr, as lines (stderr is no terminal here: no bar's \r).
    plain = ["eval", "--db", str(corpus), "--checkpoint", str(ck), "--policy-seeds", "1"]
    assert policy_cli.main([*plain, "--random-seeds", "2"]) == 0
    captured = capsys.readouterr()
    assert "policy seed 1 of 1: 2 targets" in captured.err and "\r" not in captured.err
    assert [line.split()[0] for line in captured.out.splitlines()[2:]] == ["8", "16", "32", "64"]


def test_unreadable_inputs_exit_2_with_the_reason(tmp_path, capsys):
    assert policy_cli.main(["eval", "--db", str(tmp_path / "none.jsonl.gz")]) == 2
    assert "none.jsonl.gz': no such file" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{}\n")
    assert policy_cli.main(["corpus", "--db", str(bad), "--out", str(tmp_path / "c.gz")]) == 2
    assert "bad.jsonl:1" in capsys.readouterr().err
