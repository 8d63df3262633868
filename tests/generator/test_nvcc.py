"""Running nvcc: the source's fixed place (reproducible cubins), its lock, and a
process group that dies with the build."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from cudal2.generator import nvcc
from cudal2.generator.scratch import is_stale, owned_name, sweep


@pytest.fixture
def root(tmp_path, monkeypatch) -> Path:
    """A private source root, so these tests never meet a real build's."""
    monkeypatch.setattr(nvcc, "SOURCE_ROOT", tmp_path / "src")
    return tmp_path / "src"


def test_the_source_is_compiled_at_a_fixed_path_with_a_fixed_mtime(root, tmp_path):
    with nvcc.fixed_source("ab" * 32, "int x;\n", tmp_path, 5) as cu:
        assert cu == root / ("ab" * 32) / "kernel.cu"
        assert cu.read_text() == "int x;\n" and cu.stat().st_mtime == nvcc.SOURCE_MTIME
    assert list(root.iterdir()) == []  # the folder and its lock are gone


def test_one_key_is_compiled_by_one_holder_at_a_time(root, tmp_path):
    inside, overlaps = [0], []

    def hold():
        with nvcc.fixed_source("cd" * 32, "x", tmp_path, 30):
            inside[0] += 1
            overlaps.append(inside[0])
            time.sleep(0.05)
            inside[0] -= 1

    threads = [threading.Thread(target=hold) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert overlaps == [1, 1, 1, 1]


def test_a_killed_builds_source_folder_is_swept(root, tmp_path):
    key = "ef" * 32
    root.mkdir(mode=0o1777)
    (root / key).mkdir()
    (root / key / "kernel.cu").write_text("left by a killed build")
    (root / f"{key}.lock").touch()
    assert nvcc.sweep_sources() == [root / key]
    assert list(root.iterdir()) == []


def test_a_held_source_folder_is_not_swept(root, tmp_path):
    with nvcc.fixed_source("12" * 32, "x", tmp_path, 5) as cu:
        assert nvcc.sweep_sources() == []
        assert cu.exists()


def test_a_root_of_another_user_is_not_trusted(root, tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root to give the folder away")
    root.mkdir(mode=0o777)
    os.chown(root, 65534, 65534)
    assert nvcc.source_root() == Path(f"{root}-{os.getuid()}")


def test_the_group_is_killed_at_its_time_limit(tmp_path):
    pids = tmp_path / "pids"
    cmd = ["sh", "-c", f'sleep 60 & echo "$$ $!" > {pids}.tmp; mv {pids}.tmp {pids}; wait']
    started = time.monotonic()
    run = nvcc.run_guarded(cmd, cwd=tmp_path, env=dict(os.environ), timeout_s=5)
    assert run.returncode is None and time.monotonic() - started < 15
    children = list(map(int, pids.read_text().split()))
    assert len(children) == 2 and not [pid for pid in children if _alive(pid)]


def test_a_stopped_batch_starts_nothing(tmp_path):
    stop = nvcc.Stop()
    stop.stop()
    run = nvcc.run_guarded(["touch", str(tmp_path / "ran")], cwd=tmp_path,
                           env=dict(os.environ), timeout_s=30, stop=stop)  # fmt: skip
    assert run.killed and not (tmp_path / "ran").exists()


def test_the_guard_passes_on_the_status(tmp_path):
    run = nvcc.run_guarded(["sh", "-c", "echo out; echo err >&2; exit 3"], cwd=tmp_path,
                           env=dict(os.environ), timeout_s=30)  # fmt: skip
    assert (run.returncode, run.stdout, run.stderr, run.killed) == (3, "out\n", "err\n", False)


_NICENESS = [sys.executable, "-c", "import os; print(os.nice(0))"]


def test_the_command_runs_niced_and_its_children_too(tmp_path):
    """The guard raises the niceness of what it runs, and nvcc's own children (cicc,
    ptxas) inherit it: seen from a child of the command."""
    own = os.nice(0)
    run = nvcc.run_guarded(["sh", "-c", f"{shlex.join(_NICENESS)}; exit 4"], cwd=tmp_path,
                           env=dict(os.environ), timeout_s=30, niceness=7)  # fmt: skip
    assert (run.returncode, run.stdout.strip()) == (4, str(min(own + 7, 19)))
    plain = nvcc.run_guarded(_NICENESS, cwd=tmp_path, env=dict(os.environ), timeout_s=30)
    assert plain.stdout.strip() == str(own)
    with pytest.raises(ValueError, match="niceness is raised, never lowered"):
        nvcc.run_guarded(_NICENESS, cwd=tmp_path, env=dict(os.environ), timeout_s=30,
                         niceness=-1)  # fmt: skip


def test_the_guard_takes_its_group_down_when_the_build_dies(tmp_path):
    """A parent killed with SIGKILL: the guard's group follows it (PR_SET_PDEATHSIG)."""
    if not sys.platform.startswith("linux"):
        pytest.skip("parent-death signals are Linux's")
    pids = tmp_path / "pids"
    parent = (
        "import os, sys, pathlib; from cudal2.generator import nvcc; "
        f"nvcc.run_guarded(['sh', '-c', 'sleep 60 & echo \"$$ $!\" > {pids}; wait'], "
        "cwd=pathlib.Path('.'), env=dict(os.environ), timeout_s=60)"
    )
    proc = subprocess.Popen([sys.executable, "-c", parent], cwd=tmp_path)
    deadline = time.monotonic() + 30
    while not (pids.exists() and pids.read_text().strip()):
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    children = list(map(int, pids.read_text().split()))
    deadline = time.monotonic() + 10
    while any(map(_alive, children)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [pid for pid in children if _alive(pid)]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_owned_names_tell_debris_from_work(tmp_path):
    mine = tmp_path / owned_name("build-")
    mine.mkdir()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    left = tmp_path / mine.name.replace(f".{os.getpid()}.", f".{dead}.")
    left.mkdir()
    foreign = tmp_path / "build-otherhost.1.0123456789ab"
    foreign.mkdir()
    assert not is_stale(mine, "build-") and is_stale(left, "build-")
    assert not is_stale(foreign, "build-")  # another host's: only when old
    os.utime(foreign, (0, 0))
    assert sorted(sweep(tmp_path, "build-")) == sorted([left, foreign])
    assert [p.name for p in tmp_path.iterdir()] == [mine.name]
