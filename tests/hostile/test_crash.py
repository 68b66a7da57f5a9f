"""Crash safety: `kill -9` of the server in the middle of jobs (three times) and in the middle of an
upload; after each restart every accepted job completes, none is left running, and no scratch file is
left behind. And a full disk (the data dir on a small tmpfs, where mounting is permitted): a clear
error for the upload that does not fit, no job lost, and the service goes on once there is room.
"""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path
from typing import List

import numpy as np
import pytest
import requests

from conftest import Server, start_server
from test_hostile import assert_problem, npy_of, wait_done

RNG = np.random.default_rng(1819)
# Cubes whose CPU job takes about a second (the CPU backend is fast even in a debug build: its cost
# grows with pixels x bands^2, so AVIRIS's 224 bands): long enough to be killed in the middle.
SHAPE = (384, 384, 224)  # int16: 63 MiB


def scratch_files(data_dir: Path) -> List[Path]:
    scratch = data_dir / "objects" / "scratch"
    return [p for p in scratch.rglob("*")] if scratch.exists() else []


def restart(server: Server, workdir: Path) -> Server:
    """kill -9, then the same command line again (same data dir, same instance name)."""
    server.process.kill()
    server.process.wait()
    extra = server.args[server.args.index("--workers") + 2:]
    return start_server(workdir, extra, data_dir=server.data_dir)


def statuses(server: Server) -> dict:
    jobs = server.call("GET", "/v1/jobs?limit=1000").json()["jobs"]
    return {j["id"]: j["status"] for j in jobs}


def wait_for_running(server: Server, timeout_s: float = 120.0) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        running = [i for i, s in statuses(server).items() if s == "running"]
        if running:
            return running[0]
        time.sleep(0.05)
    raise AssertionError("no job started running")


def wait_for_fresh_running(server: Server, max_age_s: float = 0.3, timeout_s: float = 120.0) -> str:
    """A job that started running less than `max_age_s` ago (a job takes over a second: killing now
    is surely in its middle, not in the instant it finishes)."""
    from datetime import datetime, timezone

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for j in server.call("GET", "/v1/jobs?status=running").json()["jobs"]:
            started = datetime.fromisoformat(j["started_at"].replace("Z", "+00:00"))
            if (datetime.now(timezone.utc) - started).total_seconds() < max_age_s:
                return j["id"]
        time.sleep(0.02)
    raise AssertionError("no job started running")


def test_kill_9_in_the_middle_of_jobs_three_times(tmp_path):
    work = tmp_path / "crash"
    server = start_server(work, ["--max-upload-bytes", str(128 << 20)])
    cubes = [RNG.integers(0, 4000, size=SHAPE).astype(np.int16) for _ in range(4)]
    ids = []
    for c in cubes:
        r = server.call("POST", "/v1/jobs?components=3", data=npy_of(c), headers={"Content-Type": "application/x-npy"})
        assert r.status_code == 202, r.text
        ids.append(r.json()["id"])
    killed_running = []
    for _ in range(3):
        killed_running.append(wait_for_fresh_running(server))
        server = restart(server, work)
        # The job really was killed while running: the new process found it running and queued it again.
        assert "queued again" in server.log_text(), server.log_text()[-2000:]
    for i in ids:
        job = wait_done(server, i, timeout_s=300)
        assert job["status"] == "succeeded", job
    assert set(statuses(server).values()) == {"succeeded"}
    assert scratch_files(server.data_dir) == []
    assert server.panics() == 0

    # A job that was killed while running gives the same result as one that never was.
    first = killed_running[0]
    fresh = start_server(tmp_path / "fresh", ["--max-upload-bytes", str(128 << 20)])
    r = fresh.call("POST", "/v1/jobs?components=3", data=npy_of(cubes[ids.index(first)]), headers={"Content-Type": "application/x-npy"})
    assert wait_done(fresh, r.json()["id"], timeout_s=300)["status"] == "succeeded"
    got = server.call("GET", f"/v1/jobs/{first}/result").content
    want = fresh.call("GET", f"/v1/jobs/{r.json()['id']}/result").content
    assert got == want and len(got) > 0
    fresh.stop()
    server.stop()


def test_kill_9_in_the_middle_of_an_upload(tmp_path):
    work = tmp_path / "upload-crash"
    server = start_server(work, ["--max-upload-bytes", str(256 << 20)])
    before = statuses(server)
    shape = (1024, 1024, 24)  # 96 MiB of float32, sent slowly
    header = npy_of(np.zeros((1, 1, 1), dtype=np.float32))  # replaced below: only the header's form
    d = f"{{'descr': '<f4', 'fortran_order': False, 'shape': {shape}, }}"
    d += " " * ((-(10 + len(d) + 1)) % 64) + "\n"
    header = b"\x93NUMPY\x01\x00" + len(d).to_bytes(2, "little") + d.encode()
    chunk = bytes(1 << 20)
    outcome: List[object] = []

    def body():
        yield header
        for _ in range(96):
            yield chunk
            time.sleep(0.05)

    def send():
        try:
            outcome.append(requests.post(server.url + "/v1/jobs", data=body(), headers={"Content-Type": "application/x-npy"}, timeout=120))
        except requests.RequestException as e:
            outcome.append(e)

    t = threading.Thread(target=send)
    t.start()
    deadline = time.monotonic() + 60
    while not any(p.is_file() and p.stat().st_size > (8 << 20) for p in scratch_files(server.data_dir)):
        assert time.monotonic() < deadline, "the upload never reached scratch"
        time.sleep(0.05)
    server = restart(server, work)
    t.join(timeout=120)
    assert outcome and isinstance(outcome[0], requests.RequestException), outcome
    # The half-received upload is gone, no job was made of it, and the service works.
    assert scratch_files(server.data_dir) == []
    assert statuses(server) == before
    r = server.call("POST", "/v1/jobs", data=npy_of(RNG.normal(size=(10, 11, 4)).astype(np.float32)), headers={"Content-Type": "application/x-npy"})
    assert wait_done(server, r.json()["id"])["status"] == "succeeded"
    assert scratch_files(server.data_dir) == []
    assert server.panics() == 0
    server.stop()


def mount_tmpfs(mnt: Path, size_mib: int) -> None:
    """A tmpfs of `size_mib` at `mnt`, or a skip that says why there is none."""
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mib}m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"skipped: cannot mount a small tmpfs here ({r.stderr.strip() or r.returncode}); "
                    "it needs root and permission to mount")


@pytest.fixture
def small_disk(tmp_path):
    """A 24 MiB tmpfs."""
    mnt = tmp_path / "disk"
    mount_tmpfs(mnt, 24)
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.fixture
def disk(tmp_path):
    """A 256 MiB tmpfs (room for a big cube and its results)."""
    mnt = tmp_path / "disk"
    mount_tmpfs(mnt, 256)
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_full_disk(tmp_path, small_disk):
    server = start_server(tmp_path / "full", ["--max-upload-bytes", str(64 << 20)], data_dir=small_disk / "data")
    small = npy_of(RNG.normal(size=(20, 21, 5)).astype(np.float32))
    r = server.call("POST", "/v1/jobs", data=small, headers={"Content-Type": "application/x-npy"})
    assert r.status_code == 202, r.text
    accepted = r.json()["id"]
    # 32 MiB does not fit a 24 MiB disk: a clear error, before or while the body is read.
    big = npy_of(np.zeros((512, 512, 32), dtype=np.float32))
    r = server.call("POST", "/v1/jobs", data=big, headers={"Content-Type": "application/x-npy"}, allow_5xx=(507,))
    assert_problem(r, 507, "insufficient_storage")
    # Nothing of it is left, the accepted job completes, and a new one is taken.
    assert scratch_files(server.data_dir) == []
    assert wait_done(server, accepted)["status"] == "succeeded"
    r = server.call("POST", "/v1/jobs", data=npy_of(RNG.normal(size=(12, 13, 4)).astype(np.float32)), headers={"Content-Type": "application/x-npy"})
    assert r.status_code == 202, r.text
    assert wait_done(server, r.json()["id"])["status"] == "succeeded"
    assert server.panics() == 0
    server.stop()


def read_only_objects(data_dir: Path) -> Path:
    """Makes DATA_DIR/objects (uploads, results, scratch) read-only under the running server: a
    read-only bind mount of it over itself (the database beside it stays writable)."""
    objects = data_dir / "objects"
    subprocess.run(["mount", "--bind", str(objects), str(objects)], check=True)
    subprocess.run(["mount", "-o", "remount,bind,ro", str(objects)], check=True)
    return objects


def test_unwritable_data_dir(tmp_path, disk):
    """The data dir's files turn read-only under a running server: uploads get a clear 503, and the
    jobs accepted before are not lost: they are not failed while the disk cannot be written, and they
    complete once it can (a job that could not write is claimed again when its lease lapses: 3 s here)."""
    work = tmp_path / "ro"
    server = start_server(work, ["--lease", "3s", "--max-upload-bytes", str(128 << 20)], data_dir=disk / "data")
    # One worker: a job of about a second runs while two small ones wait behind it, so that these two
    # surely meet the read-only disk.
    cubes = [RNG.integers(0, 4000, size=SHAPE).astype(np.int16)] + [RNG.normal(size=(20, 21, 5)).astype(np.float32) for _ in range(2)]
    ids = []
    for c in cubes:
        r = server.call("POST", "/v1/jobs?components=2", data=npy_of(c), headers={"Content-Type": "application/x-npy"})
        assert r.status_code == 202, r.text
        ids.append(r.json()["id"])
    wait_for_fresh_running(server)
    objects = read_only_objects(server.data_dir)
    try:
        r = server.call("POST", "/v1/jobs", data=npy_of(RNG.normal(size=(10, 11, 4)).astype(np.float32)),
                        headers={"Content-Type": "application/x-npy"}, allow_5xx=(503,))
        assert_problem(r, 503, "storage_unavailable")
        assert server.healthy()
        assert server.call("GET", f"/v1/jobs/{ids[0]}").status_code == 200
        # Several leases' worth of attempts: none of them fails the jobs.
        time.sleep(8)
        during = {i: server.call("GET", f"/v1/jobs/{i}").json()["status"] for i in ids}
        assert "failed" not in during.values(), during
        assert {"queued", "running"} & set(during.values()), during
        assert "cannot write this instance's disk" in server.log_text()
    finally:
        subprocess.run(["umount", str(objects)], check=True)
    for i in ids:
        job = wait_done(server, i, timeout_s=300)
        assert job["status"] == "succeeded", job
    assert scratch_files(server.data_dir) == []
    server.stop()
