"""Load: 50 concurrent clients each submitting a cube and polling it to the end (then downloading the
result), while 200 concurrent readers poll job status; on this project's 2-core machines. Zero errors,
the p99 status latency printed, and the server's peak RSS below a bound derived from --workers and the
cube sizes.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import List

import numpy as np
import requests

from conftest import start_server
from test_hostile import npy_of

CLIENTS = 50
READERS = 200
READS_EACH = 15
WORKERS = 2
SHAPE = (96, 96, 32)  # float32: 1.1 MiB per cube
CUBE_BYTES = SHAPE[0] * SHAPE[1] * SHAPE[2] * 4
COMPONENTS = 5


def rss_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def memory_bound_kib(base_kib: int) -> int:
    """What the server may hold at its peak, from what it does:
    - per running job (--workers of them): the input cube, its samples widened to float64 a chunk of
      lines at a time (at most the whole cube again, twice its bytes for float32), the components
      (pixels x k float32) and the result files' write buffers: 4 x the cube bytes, plus 32 MiB for the
      CPU backend's per-thread accumulators and the eigen step;
    - per upload in flight (all clients at once, at worst): the body batched for the writer and the
      hasher (both share one copy), up to the whole body of a cube this size;
    - the process as it stood before the load (base), plus 64 MiB for the 250 connections, the
      blocking threads and the allocator's slack.
    """
    per_job = 4 * CUBE_BYTES + (32 << 20)
    per_upload = CUBE_BYTES
    return base_kib + (WORKERS * per_job + CLIENTS * per_upload + (64 << 20)) // 1024


def test_50_clients_and_200_readers(tmp_path):
    server = start_server(tmp_path / "load", [], workers=WORKERS)
    pid = server.process.pid
    base = rss_kib(pid, "VmRSS")
    rng = np.random.default_rng(50)
    cubes = [npy_of(rng.normal(size=SHAPE).astype(np.float32)) for _ in range(CLIENTS)]
    errors: List[str] = []
    ids: List[str] = []
    ids_ready = threading.Event()
    latencies: List[float] = []
    lock = threading.Lock()
    start = threading.Barrier(CLIENTS + READERS)

    def client(n: int):
        try:
            start.wait()
            r = server.call("POST", f"/v1/jobs?components={COMPONENTS}", data=cubes[n], headers={"Content-Type": "application/x-npy"}, timeout=120)
            if r.status_code != 202:
                raise AssertionError(f"submit: {r.status_code} {r.text[:200]}")
            job_id = r.json()["id"]
            with lock:
                ids.append(job_id)
                if len(ids) >= 10:
                    ids_ready.set()
            deadline = time.monotonic() + 600
            while True:
                job = server.call("GET", f"/v1/jobs/{job_id}", timeout=60).json()
                if job["status"] == "succeeded":
                    break
                if job["status"] in ("failed", "canceled") or time.monotonic() > deadline:
                    raise AssertionError(f"job {job_id}: {job['status']} {job.get('error')}")
                time.sleep(0.2)
            res = server.call("GET", f"/v1/jobs/{job_id}/result", timeout=120)
            if res.status_code != 200 or len(res.content) < SHAPE[0] * SHAPE[1] * COMPONENTS * 4:
                raise AssertionError(f"result: {res.status_code}, {len(res.content)} bytes")
        except Exception as e:  # noqa: BLE001 - every failure is counted and shown
            with lock:
                errors.append(f"client {n}: {e!r}")

    def reader(n: int):
        session = requests.Session()  # a client polling status keeps its connection
        try:
            start.wait()
            ids_ready.wait(timeout=120)
            for k in range(READS_EACH):
                with lock:
                    job_id = ids[(n + k) % len(ids)]
                t = time.perf_counter()
                r = server.call("GET", f"/v1/jobs/{job_id}", timeout=60, session=session)
                dt = time.perf_counter() - t
                if r.status_code != 200:
                    raise AssertionError(f"status read: {r.status_code} {r.text[:200]}")
                with lock:
                    latencies.append(dt)
        except Exception as e:  # noqa: BLE001
            with lock:
                errors.append(f"reader {n}: {e!r}")
        finally:
            session.close()

    threads = [threading.Thread(target=client, args=(n,)) for n in range(CLIENTS)]
    threads += [threading.Thread(target=reader, args=(n,)) for n in range(READERS)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=900)
    wall = time.monotonic() - t0
    peak = rss_kib(pid, "VmHWM")
    bound = memory_bound_kib(base)
    lat = np.array(latencies) * 1e3
    print(
        f"\nload: {CLIENTS} clients (submit, poll, download) + {READERS} readers x {READS_EACH} status reads, "
        f"--workers {WORKERS}, cubes {SHAPE} float32: {wall:.1f} s, errors {len(errors)}; status latency "
        f"p50 {np.percentile(lat, 50):.1f} ms, p99 {np.percentile(lat, 99):.1f} ms, max {lat.max():.1f} ms "
        f"over {len(lat)} reads; peak RSS {peak // 1024} MiB (base {base // 1024} MiB, bound {bound // 1024} MiB)"
    )
    assert errors == [], "\n".join(errors[:20])
    assert len(latencies) == READERS * READS_EACH
    assert not any(t.is_alive() for t in threads)
    assert peak <= bound, f"peak RSS {peak} KiB over the bound {bound} KiB"
    assert server.panics() == 0
    server.stop()
