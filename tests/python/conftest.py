"""Shared fixtures: where the repository, its test data and the hypermnf binary are."""

import os
import pathlib
import shutil

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "data"


def find_binary() -> str:
    env = os.environ.get("HYPERMNF_BIN")
    if env:
        return env
    for profile in ("release", "debug"):
        p = REPO / "target" / profile / "hypermnf"
        if p.exists():
            return str(p)
    found = shutil.which("hypermnf")
    if found:
        return found
    raise RuntimeError("hypermnf binary not found: build it (cargo build) or set HYPERMNF_BIN")


@pytest.fixture(scope="session")
def hypermnf_bin() -> str:
    return find_binary()
