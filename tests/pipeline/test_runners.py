"""Runner selection: ``[runner]`` / ``cudal2-build --runner`` -> ``pipeline.runners.make_runner``
-> the runner the build measures through; what cannot be made here is exit 2 with the
reason, nothing written."""

from __future__ import annotations

import dataclasses
import importlib.util
import shutil

import pytest

from cudal2.cli import build as build_cli
from cudal2.manifest import RunnerSettings
from cudal2.pipeline import runners
from cudal2.pipeline.build import Build
from cudal2.verify.host import HostRunner
from cudal2.verify.local import LocalRunner
from cudal2.verify.replay import ReplayRunner

MANIFEST = """[package]
name = "t"
version = "0.1.0"
{runner}
[[targets]]
shapes = [[64, 4096, 4096]]
"""
H100 = "NVIDIA H100 80GB HBM3"


def gpus(monkeypatch, n: int) -> None:
    names = [H100] * n
    monkeypatch.setattr("cudal2.pipeline.build.gpu_names", lambda: names)
    monkeypatch.setattr("cudal2.pipeline.runners.gpu_names", lambda: names)
    monkeypatch.setattr("cudal2.verify.host.gpu_names", lambda: names)


@pytest.mark.parametrize(
    "settings, kind, devices",
    [
        (RunnerSettings(), LocalRunner, [3]),
        (RunnerSettings(job_timeout_s=7.0), LocalRunner, [3]),
        (RunnerSettings(kind="host"), HostRunner, [0, 1, 2, 3]),
        (RunnerSettings(kind="host", devices=(2, 0)), HostRunner, [2, 0]),
    ],
)
def test_make_runner_makes_the_kind_asked_for(monkeypatch, settings, kind, devices):
    gpus(monkeypatch, 4)
    r = runners.make_runner(settings, device=3)  # nothing started: no GPU needed
    assert type(r) is kind
    pools = r.pools if isinstance(r, HostRunner) else [r.pool]
    assert [p.device for p in pools] == devices
    assert {p.job_timeout_s for p in pools} == {settings.job_timeout_s}


@pytest.mark.parametrize(
    "settings, visible, message",
    [
        (RunnerSettings(kind="host", devices=(0, 4)), 4, "CUDA devices this host does not have"),
        (RunnerSettings(kind="host"), 0, "found no GPU"),
        (RunnerSettings(kind="ray"), 1, "pip install 'cudal2[ray]'"),
    ],
)
def test_a_runner_that_cannot_be_made_here_says_why(monkeypatch, settings, visible, message):
    gpus(monkeypatch, visible)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)  # no Ray here
    with pytest.raises(runners.RunnerUnavailableError, match=message.replace("[", r"\[")):
        runners.make_runner(settings)


def test_the_build_measures_through_the_manifests_runner(monkeypatch, tmp_path):
    made = []
    monkeypatch.setattr(
        "cudal2.pipeline.build.make_runner",
        lambda s, device, log: made.append((s, device, log)) or "r",
    )
    path = tmp_path / "m.toml"
    path.write_text(MANIFEST.format(runner="[runner]\nkind = 'ray'\n"))
    from cudal2.generator.compile import ArtifactCache
    from cudal2.manifest import load_manifest

    m = load_manifest(path)
    b = Build(m, tmp_path / "db.jsonl", ArtifactCache(tmp_path / "c"), tmp_path, device=1)
    gpus(monkeypatch, 0)  # ray needs no GPU here
    assert b._default_runner([]) == "r" and made == [(m.runner, 1, b.say)]
    b.measure = False  # --no-measure: a replay of the database, whatever the runner
    with pytest.raises(Exception, match="no recorded measurements"):
        b._default_runner([])
    host = Build(
        dataclasses.replace(m, runner=RunnerSettings(kind="host")),
        tmp_path / "db.jsonl",
        ArtifactCache(tmp_path / "c"),
        tmp_path,
    )
    gpus(monkeypatch, 0)  # host without a GPU: the replay, as the local runner
    recorded = [x for x in _recorded() if x.target in set(m.targets)]
    assert recorded
    assert isinstance(host._default_runner(recorded), ReplayRunner)


def _recorded():
    from cudal2.database import MeasurementDB
    from cudal2.manifest import default_manifest_path

    return MeasurementDB(default_manifest_path().with_name("default.measurements.jsonl")).read()


# -- the CLI ------------------------------------------------------------------------------
CLI_BAD = [
    # manifest [runner], arguments, what the one-line error says
    ("", ["--runner", "slurm"], "argument --runner: invalid choice: 'slurm'"),
    ("", ["--ray-address", "auto"], "--ray-address goes with the ray runner"),
    ("", ["--runner", "host", "--ray-address", "auto"], "--ray-address goes with the ray runner"),
    ("[runner]\nkind = 'ray'\n", ["--ray-address", " "], "--ray-address must not be empty"),
    ("[runner]\nkind = 'ray'\n", [], "pip install 'cudal2[ray]'"),
    ("", ["--runner", "ray", "--ray-address", "ray://head:10001"], "pip install 'cudal2[ray]'"),
    ("[runner]\nkind = 'host'\ndevices = [0, 7]\n", [], "CUDA devices this host does not have"),
    ("[runner]\nkind = 'local'\n", ["--runner", "host"], "found no GPU"),
]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="the build imports the compiler")
@pytest.mark.parametrize("runner, argv, message", CLI_BAD)
def test_cli_runner_errors_exit_2_and_write_nothing(
    monkeypatch, tmp_path, capsys, runner, argv, message
):
    gpus(monkeypatch, 2 if "devices" in runner else 0)
    if "found no GPU" in message:  # a GPU for the build's check, none for the host runner's
        monkeypatch.setattr("cudal2.pipeline.build.gpu_names", lambda: [H100])
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)  # no Ray here
    path = tmp_path / "m.toml"
    path.write_text(MANIFEST.format(runner=runner))
    db = tmp_path / "m.measurements.jsonl"
    code = build_cli.main([str(path), "--out", str(tmp_path / "out"), *argv])
    err = capsys.readouterr().err
    assert code == 2, err
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert not db.exists() and not (tmp_path / "out").exists()


def test_cli_runner_overrides_the_manifest(monkeypatch, tmp_path):
    """--runner / --ray-address reach the build as the manifest's [runner]."""
    seen = []

    class Stop(Exception):
        pass

    def fake_build(manifest, *a, **kw):
        seen.append(manifest.runner)
        raise Stop

    monkeypatch.setattr("cudal2.pipeline.build.Build", fake_build)
    path = tmp_path / "m.toml"
    path.write_text(
        MANIFEST.format(runner="[runner]\nkind = 'host'\ndevices = [1]\njob_timeout_s = 9\n")
    )
    for argv in (
        [],
        ["--runner", "host"],
        ["--runner", "local"],
        ["--runner", "ray", "--ray-address", "auto"],
    ):
        with pytest.raises(Stop):
            build_cli.main([str(path), "--out", str(tmp_path / "o"), *argv])
    assert seen == [
        RunnerSettings(kind="host", devices=(1,), job_timeout_s=9.0),
        RunnerSettings(kind="host", devices=(1,), job_timeout_s=9.0),
        RunnerSettings(kind="local", job_timeout_s=9.0),
        RunnerSettings(kind="ray", ray_address="auto", job_timeout_s=9.0),
    ]
