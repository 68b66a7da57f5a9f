"""Jobs per second of a hypermnf cluster (scripts/bench-cluster.sh starts it and runs this once per
instance count). A stream of distinct small cubes (no two alike, so the job cache never answers) is
submitted round-robin over the instances by a few client threads, each job polled to `succeeded`;
the rate is jobs / (last success - first submit). Prints one JSON line.

    bench_cluster.py --jobs N --lines L --samples S --bands B --seed K URL [URL ...]
"""

import argparse
import io
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import requests


def npy(cube: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, cube)
    return buf.getvalue()


def cube(seed: int, lines: int, samples: int, bands: int) -> np.ndarray:
    # A low-rank signal plus noise, as the MNF expects; every seed a different cube.
    rng = np.random.default_rng(seed)
    signal = rng.normal(size=(lines * samples, 4)) @ rng.normal(size=(4, bands)) * 10
    return (signal + rng.normal(size=(lines * samples, bands))).reshape(lines, samples, bands).astype(np.float32)


def run_one(url: str, body: bytes) -> float:
    r = requests.post(f"{url}/v1/jobs?components=5", data=body,
                      headers={"Content-Type": "application/x-npy"}, timeout=(5, 120))
    r.raise_for_status()
    job = r.json()
    deadline = time.monotonic() + 300
    while job["status"] not in ("succeeded", "failed", "canceled"):
        if time.monotonic() > deadline:
            raise RuntimeError(f"job {job['id']} not finished after 300 s")
        time.sleep(0.02)
        job = requests.get(f"{url}/v1/jobs/{job['id']}", timeout=(5, 30)).json()
    if job["status"] != "succeeded":
        raise RuntimeError(f"job {job['id']} ended {job['status']}: {job.get('error')}")
    return time.monotonic()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=60)
    ap.add_argument("--lines", type=int, default=64)
    ap.add_argument("--samples", type=int, default=64)
    ap.add_argument("--bands", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("urls", nargs="+")
    a = ap.parse_args()
    bodies = [npy(cube(a.seed + i, a.lines, a.samples, a.bands)) for i in range(a.jobs)]
    start = time.monotonic()
    with ThreadPoolExecutor(a.clients) as pool:
        ends = list(pool.map(lambda i: run_one(a.urls[i % len(a.urls)], bodies[i]), range(a.jobs)))
    took = max(ends) - start
    print(json.dumps({"instances": len(a.urls), "jobs": a.jobs, "seconds": round(took, 3),
                      "jobs_per_s": round(a.jobs / took, 2),
                      "cube": [a.lines, a.samples, a.bands], "clients": a.clients}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
