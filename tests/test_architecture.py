"""The layering (pyproject's import-linter contracts) is a checked fact: lint-imports
passes on a regular install of the tree, sees every module of every subpackage, and
fails for each kind of breach the contracts exist to stop.

import-linter walks the installed package's folders; an editable install's package-dir
mapping hides the subpackages from it, so each check runs on a ``pip install --target``
of a copy of the tree (.ci/run does the same).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PACKAGE_DIRS: dict[str, str] = PYPROJECT["tool"]["setuptools"]["package-dir"]

pytest.importorskip("importlinter", reason="import-linter is in the test extra")

# (what is broken, file of the installed package, line appended, contract that must break)
BREACHES = [
    ("records imports the pipeline", "records.py", "import cudal2.pipeline.build", "Layers"),
    ("verify runs nvcc", "verify/timing.py", "import cudal2.generator.compile", "nvcc"),
    ("the generator touches a GPU", "generator/render.py", "import torch", "GPU"),
    ("generator imports the policy", "generator/space.py", "import cudal2.policy", "Layers"),
    ("policy imports packaging", "policy/grid.py", "import cudal2.packaging.wheel", "Layers"),
    ("runtime imports records", "packaging/runtime/driver.py", "import cudal2.records", "runtime"),
    (
        "runtime imports the wheel",
        "packaging/runtime/table.py",
        "import cudal2.packaging.wheel",
        "Layers",
    ),
    ("a cycle in the runtime", "packaging/runtime/abi.py", "from . import api", "cycles"),
    (
        "the native build imports the wheel",
        "packaging/native_build.py",
        "import cudal2.packaging.wheel",
        "Layers",
    ),
    (
        "runtime imports the native build",
        "packaging/runtime/api.py",
        "import cudal2.packaging.native_build",
        "runtime",
    ),
    ("a module no layer names", "stray.py", "import cudal2.records", "Layers"),
]


def _install(tmp: Path) -> Path:
    """A regular install of a copy of the tree (no build/ debris in the checkout)."""
    src = tmp / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.jsonl", "*.gz", "*.safetensors")
    for d in {*PACKAGE_DIRS.values()}:
        shutil.copytree(ROOT / d, src / d, ignore=ignore)
    for f in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / f, src / f)
    site = tmp / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
         "--no-compile", "--target", str(site), str(src)],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    return site


def _lint(site: Path) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("lint-imports")
    # importlinter.cli has no __main__ guard (``python -m`` would do nothing): call its
    # click command where the interpreter has no lint-imports script beside it.
    main = "import sys; from importlinter.cli import lint_imports_command as m; sys.exit(m())"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-c", main]
    return subprocess.run(
        [*cmd, "--config", str(ROOT / "pyproject.toml"), "--no-cache"],
        cwd=site.parent,
        env={**os.environ, "PYTHONPATH": str(site)},
        capture_output=True,
        text=True,
    )


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    return _install(tmp_path_factory.mktemp("arch"))


def test_contracts_hold_on_the_tree(site):
    res = _lint(site)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "0 broken" in res.stdout


def test_the_graph_holds_every_module_of_every_subpackage(site):
    """A contract over a graph that misses a subpackage cannot fail for it."""
    code = "import grimp; print(*sorted(grimp.build_graph('cudal2', cache_dir=None).modules))"
    res = subprocess.run(
        [sys.executable, "-c", code],
        cwd=site.parent,
        env={**os.environ, "PYTHONPATH": str(site)},
        capture_output=True,
        text=True,
        check=True,
    )
    seen = set(res.stdout.split())
    expected = set()
    for pkg, folder in PACKAGE_DIRS.items():
        for py in (ROOT / folder).rglob("*.py"):
            rel = py.relative_to(ROOT / folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            if any(PACKAGE_DIRS.get(".".join([pkg, *parts[:i]])) for i in range(1, len(parts))):
                continue  # a mapped subpackage of its own (listed under its own name)
            expected.add(".".join([pkg, *parts]))
    missing = expected - seen
    assert not missing, f"import-linter does not see: {sorted(missing)}"
    assert len(expected) > 60


@pytest.mark.parametrize(
    ("breach", "path", "line", "contract"), BREACHES, ids=[b[0] for b in BREACHES]
)
def test_each_breach_breaks_a_contract(tmp_path, site, breach, path, line, contract):
    broken = tmp_path / "site"
    shutil.copytree(site, broken)
    target = broken / "cudal2" / path
    with target.open("a") as f:
        f.write(f"\n{line}  # {breach}\n")
    res = _lint(broken)
    assert res.returncode != 0, f"{breach}: lint-imports passed\n{res.stdout}"
    # "... BROKEN", or "... BROKEN (1 ignored import)" for a contract with an exception
    broken_lines = [ln for ln in res.stdout.splitlines() if re.search(r" BROKEN( \(|$)", ln)]
    assert any(contract in ln for ln in broken_lines), res.stdout
