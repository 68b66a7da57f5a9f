"""Fixtures: one real `hypermnf serve` per test run, with `--input-root tests/data`, the CPU backend and
two API keys (alice and bob), and OWSLib's `Processes` client holding alice's key."""

from __future__ import annotations

import io
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest
import requests

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "data"
KEYS = {"alice": "alice-key-0123456789", "bob": "bob-key-9876543210"}
START_TIMEOUT_S = 60.0


def find_binary() -> Path:
    """$HYPERMNF_BIN, else the newest of target/{release,debug}/hypermnf."""
    env = os.environ.get("HYPERMNF_BIN")
    if env:
        return Path(env)
    found = [p for p in (REPO / "target" / d / "hypermnf" for d in ("release", "debug")) if p.is_file()]
    if not found:
        pytest.exit("no hypermnf binary: run `cargo build` or set HYPERMNF_BIN", returncode=2)
    return max(found, key=lambda p: p.stat().st_mtime)


@dataclass
class Server:
    url: str
    log: Path
    # A second --input-root, empty at start: tests write the cubes they execute by reference here.
    inputs: Path

    def headers(self, who: str = "alice") -> dict:
        return {"Authorization": f"Bearer {KEYS[who]}"}

    def get(self, path: str, who: str = "alice", **kw) -> requests.Response:
        return requests.get(self.url + path, headers={**self.headers(who), **kw.pop("headers", {})}, timeout=60, **kw)

    def post(self, path: str, who: str = "alice", **kw) -> requests.Response:
        return requests.post(self.url + path, headers={**self.headers(who), **kw.pop("headers", {})}, timeout=60, **kw)

    def delete(self, path: str, who: str = "alice") -> requests.Response:
        return requests.delete(self.url + path, headers=self.headers(who), timeout=60)


@pytest.fixture(scope="session")
def binary() -> Path:
    return find_binary()


@pytest.fixture(scope="session")
def server(tmp_path_factory, binary) -> Iterator[Server]:
    work = tmp_path_factory.mktemp("ogc-server")
    keys = work / "keys.txt"
    keys.write_text("".join(f"{name}:{key}\n" for name, key in KEYS.items()))
    log = work / "server.log"
    out = work / "stdout"
    inputs = (work / "inputs").resolve()
    inputs.mkdir()
    with open(log, "w") as err, open(out, "w") as stdout:
        proc = subprocess.Popen(
            [str(binary), "serve", "--listen", "127.0.0.1:0", "--data-dir", str(work / "data"),
             "--input-root", str(DATA), "--input-root", str(inputs), "--backend", "cpu", "--api-keys-file", str(keys), "--workers", "2"],
            stdout=stdout, stderr=err,
        )
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        url = None
        while url is None:
            for line in out.read_text().splitlines():
                if line.startswith("listening on "):
                    url = line.removeprefix("listening on ").strip()
            if url is None:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail("the server did not start:\n" + log.read_text(errors="replace"))
                time.sleep(0.1)
        yield Server(url=url, log=log, inputs=inputs)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if "panicked" in log.read_text(errors="replace"):
        pytest.fail("the server panicked:\n" + log.read_text(errors="replace"))


@pytest.fixture()
def processes(server):
    """OWSLib's client, holding alice's key (OWSLib keeps its headers in a module-level dict, so each
    test gets them set afresh)."""
    from owslib.ogcapi.processes import Processes

    return Processes(server.url, headers=server.headers("alice"))


def salinas() -> np.ndarray:
    """The Salinas-A chip as (lines, samples, bands): BIP, big-endian int16 (tests/data/README.md)."""
    raw = np.fromfile(DATA / "salinasA_224_bip_be.img", dtype=">i2")
    return raw.reshape(83, 86, 224)


def npy_bytes(cube: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, cube)
    return buf.getvalue()
