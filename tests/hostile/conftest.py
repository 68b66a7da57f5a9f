"""Live `hypermnf serve` processes for the hostile-input and auth tests, and a recorder of every answer.

The server is the debug binary ($HYPERMNF_BIN, else target/debug/hypermnf), started on a free port with
its own data dir and its log in a file; the tests count the log's panics ("panicked at") at the end.
Every request goes through `Recorder.call`, which applies a per-request timeout and keeps the counts of
5xx answers and hangs (requests that timed out) that the summary test asserts are zero.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

import pytest
import requests

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
DATA = REPO / "tests" / "data"
START_TIMEOUT_S = 60.0
# Long enough for a debug build on a busy 2-core machine, short enough to call a stuck request a hang.
REQUEST_TIMEOUT_S = 30.0
# The upload limit the hostile server runs with: above the 10 MB header case (which the 1 MiB part
# limit must refuse), below what a test would want to send to go past it.
MAX_UPLOAD_BYTES = 16 << 20


def find_binary() -> Path:
    env = os.environ.get("HYPERMNF_BIN")
    path = Path(env) if env else REPO / "target" / "debug" / "hypermnf"
    if not path.is_file():
        pytest.exit(f"no hypermnf binary at {path}: run `cargo build --bins` or set HYPERMNF_BIN", returncode=2)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Recorder:
    """Counts of what the server answered, over the whole test run."""

    answers: int = 0
    server_errors: List[str] = field(default_factory=list)
    hangs: List[str] = field(default_factory=list)

    def call(self, method: str, url: str, allow_5xx: tuple = (), session: Optional[requests.Session] = None, **kw) -> requests.Response:
        """One request (on `session`'s kept-alive connections when given). `allow_5xx`: server-side
        statuses the caller expects (507 on a full disk), which are then not counted as server errors."""
        kw.setdefault("timeout", REQUEST_TIMEOUT_S)
        what = f"{method} {url.split('?')[0]}"
        try:
            r = (session or requests).request(method, url, **kw)
        except requests.Timeout:
            self.hangs.append(what)
            raise
        self.answers += 1
        if r.status_code >= 500 and r.status_code not in allow_5xx:
            self.server_errors.append(f"{what} -> {r.status_code} {r.text[:200]}")
        return r


RECORDER = Recorder()


@dataclass
class Server:
    url: str
    process: subprocess.Popen
    data_dir: Path
    log: Path
    args: List[str]

    def call(self, method: str, path: str, **kw) -> requests.Response:
        return RECORDER.call(method, self.url + path, **kw)

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def panics(self) -> int:
        return self.log_text().count("panicked at")

    def healthy(self) -> bool:
        if self.process.poll() is not None:
            return False
        try:
            return self.call("GET", "/healthz", timeout=10).status_code == 200
        except requests.RequestException:
            return False

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


SERVERS: List[Server] = []


def start_server(workdir: Path, extra: List[str], data_dir: Optional[Path] = None, env: Optional[Dict[str, str]] = None,
                 workers: int = 1) -> Server:
    """Starts `hypermnf serve` (CPU backend, `workers` workers) and waits for /healthz."""
    workdir.mkdir(parents=True, exist_ok=True)
    data_dir = data_dir or workdir / "data"
    port = free_port()
    log = workdir / f"server-{port}.log"
    args = [
        str(find_binary()), "serve",
        "--listen", f"127.0.0.1:{port}",
        "--data-dir", str(data_dir),
        "--backend", "cpu",
        "--workers", str(workers),
        *extra,
    ]
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("HYPERMNF_")}
    base_env.setdefault("RUST_LOG", "info")
    base_env.update(env or {})
    with open(log, "ab") as out:
        process = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=base_env)
    server = Server(f"http://127.0.0.1:{port}", process, data_dir, log, args)
    SERVERS.append(server)
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"hypermnf serve exited with {process.returncode}:\n{server.log_text()}")
        try:
            if requests.get(server.url + "/healthz", timeout=2).status_code == 200:
                return server
        except requests.RequestException:
            pass
        if time.monotonic() > deadline:
            server.stop()
            raise RuntimeError(f"hypermnf serve did not answer /healthz in {START_TIMEOUT_S} s:\n{server.log_text()}")
        time.sleep(0.1)


@pytest.fixture(scope="session")
def server(tmp_path_factory) -> Server:
    """The hostile corpus's server: open (no keys), a small upload limit, tests/data as input root."""
    s = start_server(
        tmp_path_factory.mktemp("hostile"),
        ["--max-upload-bytes", str(MAX_UPLOAD_BYTES), "--input-root", str(DATA)],
    )
    yield s
    s.stop()


def pytest_collection_modifyitems(session, config, items):
    """The summary test counts the answers of every other test: it runs last."""
    items.sort(key=lambda item: item.name.startswith("test_summary_"))


def pytest_sessionfinish(session, exitstatus):
    for s in SERVERS:
        s.stop()
