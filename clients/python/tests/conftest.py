"""Fixtures: a real `hypermnf serve` process per test session (one open, one with API keys), the repo's
real cubes, and the CLI's own results for them (`hypermnf run`), which the service must equal exactly."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

import numpy as np
import pytest

import hypermnf

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
DATA = REPO / "tests" / "data"
CUBES = sorted(DATA.glob("*.hdr"))
# The backend both the server and the CLI use, so that results compare bit for bit.
BACKEND = os.environ.get("HYPERMNF_TEST_BACKEND", "cpu")
START_TIMEOUT_S = 60.0


def find_binary() -> Path:
    """$HYPERMNF_BIN, else the newest of the repo's target/{release,debug}/hypermnf."""
    env = os.environ.get("HYPERMNF_BIN")
    if env:
        path = Path(env)
        if not path.is_file():
            pytest.exit(f"HYPERMNF_BIN={env} is not a file", returncode=2)
        return path
    candidates = [REPO / "target" / p / "hypermnf" for p in ("release", "debug")]
    found = [c for c in candidates if c.is_file()]
    if not found:
        pytest.exit(
            "no hypermnf binary: build it with `cargo build` (or set HYPERMNF_BIN); looked in "
            + ", ".join(str(c) for c in candidates),
            returncode=2,
        )
    return max(found, key=lambda p: p.stat().st_mtime)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    """A running `hypermnf serve`."""

    url: str
    process: subprocess.Popen
    data_dir: Path
    log: Path
    # A second --input-root, empty at start: tests write the cubes they send by reference here.
    inputs: Path

    def client(self, api_key: Optional[str] = None, timeout: float = 60.0) -> hypermnf.Client:
        return hypermnf.Client(self.url, api_key=api_key, timeout=timeout)

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


def start_server(binary: Path, workdir: Path, extra: List[str]) -> Server:
    data_dir = workdir / "data"
    data_dir.mkdir(parents=True, exist_ok=True)
    inputs = (workdir / "inputs").resolve()
    inputs.mkdir(exist_ok=True)
    log = workdir / "server.log"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    args = [
        str(binary), "serve",
        "--listen", f"127.0.0.1:{port}",
        "--data-dir", str(data_dir),
        "--backend", BACKEND,
        "--workers", "1",  # test_jobs queues a job behind another
        "--input-root", str(DATA),
        "--input-root", str(inputs),
        *extra,
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("HYPERMNF_")}
    with open(log, "wb") as out:
        process = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env)
    server = Server(url, process, data_dir, log, inputs)
    deadline = time.monotonic() + START_TIMEOUT_S
    probe = hypermnf.Client(url, timeout=2.0)
    try:
        while True:
            if process.poll() is not None:
                pytest.exit(f"hypermnf serve exited with {process.returncode}:\n{server.log_text()}", returncode=2)
            try:
                if probe.health():
                    return server
            except hypermnf.HyperMNFError:
                pass
            if time.monotonic() > deadline:
                stop_server(server)
                pytest.exit(f"hypermnf serve did not answer /healthz in {START_TIMEOUT_S} s:\n{server.log_text()}", returncode=2)
            time.sleep(0.1)
    finally:
        probe.close()


def stop_server(server: Server) -> None:
    if server.process.poll() is None:
        server.process.send_signal(signal.SIGTERM)
        try:
            server.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            server.process.kill()
            server.process.wait()


@pytest.fixture(scope="session")
def binary() -> Path:
    return find_binary()


@pytest.fixture(scope="session")
def server(binary: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """An open server (no API keys) on a free loopback port."""
    s = start_server(binary, tmp_path_factory.mktemp("server"), [])
    yield s
    stop_server(s)


API_KEYS = {"alice": "alice-key-0123456789", "bob": "bob-key-9876543210"}


@pytest.fixture(scope="session")
def keyed_server(binary: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A server started with --api-keys-file (keys in API_KEYS)."""
    workdir = tmp_path_factory.mktemp("keyed")
    keys = workdir / "api-keys"
    keys.write_text("# test keys\n" + "".join(f"{name}:{key}\n" for name, key in API_KEYS.items()))
    s = start_server(binary, workdir, ["--api-keys-file", str(keys)])
    yield s
    stop_server(s)


@pytest.fixture()
def client(server: Server) -> Iterator[hypermnf.Client]:
    with server.client() as c:
        yield c


@dataclass
class CliResult:
    components: np.ndarray
    metadata: Dict
    denoised: Optional[np.ndarray]


class CliRunner:
    """Runs `hypermnf run` once per (cube, parameters) and keeps the answers for the session."""

    def __init__(self, binary: Path, workdir: Path) -> None:
        self.binary = binary
        self.workdir = workdir
        self.cache: Dict[Tuple[str, Tuple[str, ...]], CliResult] = {}

    def __call__(self, cube: Path, *args: str) -> CliResult:
        key = (str(cube), tuple(args))
        if key not in self.cache:
            out = self.workdir / f"run{len(self.cache)}" / "out.npy"
            out.parent.mkdir(parents=True)
            cmd = [str(self.binary), "run", str(cube), "--backend", BACKEND, "--out", str(out), *args]
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
            assert done.returncode == 0, f"{' '.join(cmd)} failed:\n{done.stderr}"
            denoised_path = out.with_name("out-denoised.npy")
            self.cache[key] = CliResult(
                components=np.load(out),
                metadata=json.loads(out.with_name("out.json").read_text()),
                denoised=np.load(denoised_path) if denoised_path.exists() else None,
            )
        return self.cache[key]


@pytest.fixture(scope="session")
def cli(binary: Path, tmp_path_factory: pytest.TempPathFactory) -> CliRunner:
    return CliRunner(binary, tmp_path_factory.mktemp("cli"))


def assert_same(actual: np.ndarray, expected: np.ndarray) -> None:
    """Exactly equal: same shape, same dtype, same values, NaN where the other has NaN."""
    assert actual.shape == expected.shape
    assert actual.dtype == expected.dtype
    assert np.array_equal(actual, expected, equal_nan=True), (
        f"max abs difference {np.nanmax(np.abs(actual.astype(np.float64) - expected.astype(np.float64)))}"
    )
