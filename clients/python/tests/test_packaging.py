"""Installing the package leaves the source tree as it was: no build/ and no *.egg-info (issue 34)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1]  # clients/python

# What a build backend could leave behind in the tree it builds from.
ARTIFACTS = ("build", "dist", "*.egg-info", "src/*.egg-info")


def _leftovers(tree: Path) -> list:
    return sorted(str(p.relative_to(tree)) for pattern in ARTIFACTS for p in tree.glob(pattern))


def _copy_of_the_package(tmp_path: Path) -> Path:
    """The package's sources (what `pip install ./clients/python` reads), without anything a build left."""
    tree = tmp_path / "python"
    ignore = shutil.ignore_patterns("build", "dist", "*.egg-info", "__pycache__", ".pytest_cache")
    shutil.copytree(PACKAGE, tree, ignore=ignore)
    assert _leftovers(tree) == []
    return tree


def test_pip_install_leaves_no_build_or_egg_info(tmp_path: Path) -> None:
    pytest.importorskip("hatchling", reason="the test extra installs the build backend (hatchling)")
    tree = _copy_of_the_package(tmp_path)
    target = tmp_path / "site"
    # Offline: the build backend is the one already installed (the `test` extra), not fetched.
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index",
         "--disable-pip-version-check", "--quiet", "--target", str(target), str(tree)],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert _leftovers(tree) == [], "the install wrote build artefacts into the source tree"
    installed = target / "hypermnf"
    assert (installed / "__init__.py").is_file() and (installed / "py.typed").is_file()
    assert sorted(p.name for p in installed.glob("*.py")) == sorted(p.name for p in (tree / "src" / "hypermnf").glob("*.py"))


def test_wheel_holds_the_package_and_nothing_is_left_behind(tmp_path: Path) -> None:
    pytest.importorskip("hatchling", reason="the test extra installs the build backend (hatchling)")
    tree = _copy_of_the_package(tmp_path)
    out = tmp_path / "wheels"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
         "--disable-pip-version-check", "--quiet", "--wheel-dir", str(out), str(tree)],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert _leftovers(tree) == []
    (wheel,) = out.glob("hypermnf-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "hypermnf/__init__.py" in names and "hypermnf/py.typed" in names
    assert not [n for n in names if n.startswith(("tests/", "src/"))], names
