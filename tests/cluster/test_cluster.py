"""hypermnf as a cluster, end to end: three `hypermnf serve` instances (A, B, C) sharing one PostgreSQL
job store and one S3 bucket on a real Garage server. scripts/cluster-test.sh starts all of that and
runs this file; it is not meant to run alone (it needs HYPERMNF_CLUSTER_FILE and the AWS_* variables).

The tests run in file order on one shared Cluster (pytest -x stops at the first failure):
1. all instances alive: a job submitted to A is visible from B and its result downloads from B; the
   identical request on C answers with that job and `cached: true`; a slow job submitted to A is
   canceled through B and ends `canceled`.
2. failover: a large job starts, the instance running it is kill -9ed, and once its lease runs out
   another instance runs the job to the end. The 30 jobs (real AVIRIS cubes as ENVI multipart and as
   .npy, synthetic cubes of several sizes, dtypes and seeds) are submitted before and after the kill.
3. every one of the 30 jobs ends `succeeded`, logged `job succeeded` exactly once across all the
   instances' logs (the killed one's included), and each result, downloaded from an instance other
   than the one it was submitted to where possible, is byte for byte what `hypermnf run` writes for
   the same cube and parameters.
4. DELETE of a job leaves no object of it in the bucket.
Every wait has a deadline; a failure says what was expected and what was seen.
"""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import boto3
import numpy as np
import pytest
import requests
from botocore.config import Config

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "data"
LEASE_S = float(os.environ.get("HYPERMNF_CLUSTER_LEASE_S", "5"))
UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
ANSI = re.compile(r"\x1b\[[0-9;]*m")
TERMINAL = {"succeeded", "failed", "canceled"}
HTTP_TIMEOUT = (5, 120)  # connect, read
N_JOBS = 30


def say(msg: str) -> None:
    print(f"   {time.strftime('%H:%M:%S')} {msg}", file=sys.stderr, flush=True)


@dataclass
class Instance:
    name: str
    url: str
    pid: int
    log: Path
    alive: bool = True

    def events(self, what: str) -> list[str]:
        """Job ids of this instance's log lines `job <what> ... job=<id>` (ANSI colours stripped)."""
        found = []
        pattern = re.compile(rf"\bjob {what}\b")
        for line in ANSI.sub("", self.log.read_text(errors="replace")).splitlines():
            if pattern.search(line):
                found += re.findall(rf"\bjob=\"?({UUID})", line)
        return found


@dataclass
class Job:
    name: str
    kind: str  # "npy" (the body is a .npy file) or "envi" (multipart: header + data + params)
    source: Path  # the .npy file, or the ENVI header with its .img beside it
    params: dict
    submitted_to: Instance | None = None
    id: str | None = None

    def body(self) -> dict:
        if self.kind == "npy":
            return dict(params=self.params, data=self.source.read_bytes(),
                        headers={"Content-Type": "application/x-npy"})
        img = self.source.with_suffix(".img")
        return dict(files={
            "header": (self.source.name, self.source.read_bytes(), "text/plain"),
            "data": (img.name, img.read_bytes(), "application/octet-stream"),
            "params": (None, json.dumps(self.params), "application/json"),
        })


# ---- cubes ----------------------------------------------------------------------------------------

def read_envi(header: Path) -> np.ndarray:
    """The real cubes of tests/data as (lines, samples, bands), for their .npy copies."""
    h = {}
    for line in header.read_text().splitlines():
        if "=" in line and not line.startswith(" "):
            key, _, value = line.partition("=")
            h[key.strip()] = value.strip()
    lines, samples, bands = int(h["lines"]), int(h["samples"]), int(h["bands"])
    dtype = np.dtype({"2": "i2", "12": "u2", "4": "f4"}[h["data type"]]).newbyteorder(">" if h.get("byte order") == "1" else "<")
    raw = np.fromfile(header.with_suffix(".img"), dtype=dtype, offset=int(h.get("header offset", 0)))
    shape, axes = {"bsq": ((bands, lines, samples), (1, 2, 0)), "bil": ((lines, bands, samples), (0, 2, 1)),
                   "bip": ((lines, samples, bands), (0, 1, 2))}[h["interleave"].lower()]
    return np.ascontiguousarray(raw.reshape(shape).transpose(axes)).astype(dtype.newbyteorder("="))


def synthetic_cube(seed: int, lines: int, samples: int, bands: int, dtype: str, sources: int = 10) -> np.ndarray:
    """A cube with structure: `sources` smooth non-negative abundance maps times random spectra, plus
    noise, on an offset of 1000 (so every value is positive and fits int16 / uint16: no wrap-around, no
    zeros). Its leading MNF components are well separated, so k <= sources is stable."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:lines, 0:samples].astype(np.float32) / max(lines, samples)
    maps = np.empty((lines, samples, sources), np.float32)
    for s in range(sources):
        fy, fx = rng.uniform(0.5, 4.0, 2)
        wave = np.sin(2 * np.pi * (fy * y + fx * x) + rng.uniform(0, 2 * np.pi))
        maps[..., s] = rng.uniform(0.5, 2.0) * (1 + wave) / 2
    maps += rng.random(maps.shape, dtype=np.float32) * np.float32(0.2)  # texture; abundances stay >= 0
    spectra = rng.uniform(0.1, 1.0, (sources, bands)).astype(np.float32)
    cube = maps.reshape(-1, sources) @ spectra
    cube *= np.float32(400)
    cube += np.float32(1000)
    cube += rng.standard_normal(cube.shape, dtype=np.float32) * np.float32(8)
    cube = cube.reshape(lines, samples, bands)
    if np.dtype(dtype).kind in "iu":
        cube = np.rint(cube)
    return cube.astype(dtype)


def make_jobs(work: Path) -> tuple[list[Job], Job, Job]:
    """The 30 jobs (no two identical: same cube with other parameters at most), the large job that
    gets its instance killed (one of the 30), and the slow job that is canceled (not one of them)."""
    cubes = work / "cubes"
    cubes.mkdir(parents=True, exist_ok=True)

    def npy(name: str, array: np.ndarray) -> Path:
        path = cubes / f"{name}.npy"
        np.save(path, array)
        return path

    jobs = []
    # Synthetic cubes first: the first one is small, for the cross-instance checks.
    sizes = [(40, 36, 24), (64, 48, 32), (48, 64, 48), (96, 80, 32), (80, 96, 64), (120, 100, 48), (32, 128, 96)]
    dtypes = ["f4", "i2", "u2", "f8", "f4", "i4"]
    for n in range(N_JOBS - 7):  # + 6 real + the big one
        lines, samples, bands = sizes[n % len(sizes)]
        dtype = dtypes[n % len(dtypes)]
        path = npy(f"syn{n:02d}", synthetic_cube(1000 + n, lines, samples, bands, dtype))
        jobs.append(Job(f"syn{n:02d}-{dtype}-{lines}x{samples}x{bands}", "npy", path,
                        {"components": 2 + n % 7, "noise": ["mean-filter", "shift-difference"][n % 2]}))
    # The real cubes: as ENVI multipart, and as .npy with other parameters (the same decoded cube with
    # the same parameters would be the identical request).
    real = ["salinasA_224_bip_be", "jasper_ridge_r198_bil", "abu_beach1_cat_island_bsq"]
    for n, stem in enumerate(real):
        jobs.append(Job(f"{stem}-envi", "envi", DATA / f"{stem}.hdr",
                        {"components": 10, "noise": ["mean-filter", "shift-difference"][n % 2]}))
        jobs.append(Job(f"{stem}-npy", "npy", npy(stem, read_envi(DATA / f"{stem}.hdr")),
                        {"components": 5 + n, "noise": ["shift-difference", "mean-filter"][n % 2]}))
    # Large enough to run for seconds on any machine: 400 x 400 x 128 float32 (82 MB).
    big = Job("big-f4-400x400x128", "npy", npy("big", synthetic_cube(7, 400, 400, 128, "f4")),
              {"components": 8, "noise": "mean-filter"})
    jobs.append(big)
    assert len(jobs) == N_JOBS
    slow = Job("slow-f4-320x320x128", "npy", npy("slow", synthetic_cube(8, 320, 320, 128, "f4")),
               {"components": 6, "noise": "mean-filter"})
    return jobs, big, slow


# ---- the cluster ----------------------------------------------------------------------------------

class Cluster:
    def __init__(self):
        spec = json.loads(Path(os.environ["HYPERMNF_CLUSTER_FILE"]).read_text())
        self.instances = [Instance(i["name"], i["url"], i["pid"], Path(i["log"])) for i in spec]
        self.work = Path(os.environ["HYPERMNF_CLUSTER_WORK"])
        self.bin = os.environ["HYPERMNF_BIN"]
        self.http = requests.Session()
        self.jobs, self.big, self.slow = make_jobs(self.work)
        self.victim: Instance | None = None
        # `hypermnf run` references, computed while the cluster works; two at a time.
        self.refs = {}
        self.pool = ThreadPoolExecutor(max_workers=2)
        self.procs: list[subprocess.Popen] = []
        self.lock = threading.Lock()
        self.closing = False

    def alive(self) -> list[Instance]:
        return [i for i in self.instances if i.alive]

    def other(self, inst: Instance | None) -> Instance:
        """A live instance other than `inst` (where there is one)."""
        others = [i for i in self.alive() if i is not inst]
        return others[0] if others else self.alive()[0]

    # -- HTTP
    def submit(self, inst: Instance, job: Job, expect: int = 202) -> dict:
        r = self.http.post(f"{inst.url}/v1/jobs", timeout=HTTP_TIMEOUT, **job.body())
        if r.status_code != expect:
            pytest.fail(f"POST {job.name} to {inst.name}: expected {expect}, got {r.status_code}: {r.text[:400]}")
        body = r.json()
        if expect == 202:
            if body.get("cached"):
                pytest.fail(f"{job.name} on {inst.name} was answered as a cached job {body.get('id')}: the jobs must differ")
            job.submitted_to, job.id = inst, body["id"]
        return body

    def get(self, inst: Instance, job_id: str) -> dict:
        r = self.http.get(f"{inst.url}/v1/jobs/{job_id}", timeout=HTTP_TIMEOUT)
        if r.status_code != 200:
            pytest.fail(f"GET job {job_id} from {inst.name}: {r.status_code} {r.text[:400]}")
        return r.json()

    def wait_status(self, inst: Instance, job: Job, want: set[str], timeout: float) -> dict:
        deadline, last = time.monotonic() + timeout, None
        while time.monotonic() < deadline:
            last = self.get(inst, job.id)
            if last["status"] in want:
                return last
            if last["status"] in TERMINAL:
                pytest.fail(f"{job.name} ({job.id}) ended {last['status']}, expected {sorted(want)}: {last}")
            time.sleep(0.1)
        pytest.fail(f"{job.name} ({job.id}) not {sorted(want)} within {timeout:.0f} s as seen from {inst.name}; last: {last}")

    def result(self, inst: Instance, job: Job) -> bytes:
        r = self.http.get(f"{inst.url}/v1/jobs/{job.id}/result", timeout=HTTP_TIMEOUT)
        if r.status_code != 200:
            pytest.fail(f"GET result of {job.name} ({job.id}) from {inst.name}: {r.status_code} {r.text[:400]}")
        return r.content

    # -- logs
    def events(self, what: str) -> Counter:
        """How many `job <what>` lines name each job, across every instance's log (dead ones too)."""
        return Counter(j for inst in self.instances for j in inst.events(what))

    def wait_event(self, what: str, job: Job, timeout: float) -> Instance:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for inst in self.instances:
                if job.id in inst.events(what):
                    return inst
            time.sleep(0.05)
        pytest.fail(f"no instance logged `job {what} job={job.id}` ({job.name}) within {timeout:.0f} s")

    # -- references
    def start_references(self, jobs: list[Job]) -> None:
        for job in jobs:
            self.refs[job.name] = self.pool.submit(self._reference, job)

    def _reference(self, job: Job) -> Path:
        out = self.work / "ref" / f"{job.name}.npy"
        out.parent.mkdir(exist_ok=True)
        cmd = [self.bin, "run", str(job.source), "--components", str(job.params["components"]),
               "--noise", job.params["noise"], "--backend", "cpu", "--out", str(out)]
        with self.lock:
            if self.closing:
                raise RuntimeError("closing")
            p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            self.procs.append(p)
        try:
            output, _ = p.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()
            raise RuntimeError(f"`{' '.join(cmd)}` ran past 300 s")
        if p.returncode != 0:
            raise RuntimeError(f"`{' '.join(cmd)}` exited {p.returncode}: {output[-2000:]}")
        return out

    def close(self) -> None:
        with self.lock:
            self.closing = True
            for p in self.procs:
                if p.poll() is None:
                    p.kill()
        self.pool.shutdown(wait=True, cancel_futures=True)


@pytest.fixture(scope="module")
def cluster():
    c = Cluster()
    yield c
    c.close()


def port_closed(url: str) -> bool:
    u = urlparse(url)
    try:
        socket.create_connection((u.hostname, u.port), timeout=1).close()
        return False
    except OSError:
        return True


# ---- the tests, in order --------------------------------------------------------------------------

def test_instances_ready(cluster):
    assert len(cluster.instances) == 3, "cluster-test.sh starts three instances"
    for inst in cluster.instances:
        r = cluster.http.get(f"{inst.url}/readyz", timeout=HTTP_TIMEOUT)
        assert r.status_code == 200, f"{inst.name} /readyz: {r.status_code} {r.text[:300]}"
    # All references start now, so that they are done when the results are.
    cluster.start_references(cluster.jobs)


def test_any_instance_sees_cancels_and_serves_any_job(cluster):
    a, b, c = cluster.instances
    first = cluster.jobs[:9]
    for n, job in enumerate(first):
        cluster.submit(cluster.instances[n % 3], job)
    x = first[0]
    assert x.submitted_to is a
    say(f"submitted {len(first)} jobs over A, B, C; {x.name} ({x.id}) to A")

    seen = cluster.get(b, x.id)
    assert seen["id"] == x.id, f"B answers job {x.id} with {seen}"
    cluster.wait_status(b, x, {"succeeded"}, timeout=120)
    data = cluster.result(b, x)
    assert data[:6] == b"\x93NUMPY", f"the result of {x.name} from B is not a .npy file: {data[:40]!r}"
    say(f"{x.name}: visible from B, succeeded, result ({len(data)} bytes) downloaded from B")

    again = cluster.submit(c, x, expect=200)
    assert again.get("cached") is True, f"the identical request on C answered without cached: true: {again}"
    assert again["id"] == x.id, f"the identical request on C answered job {again['id']}, not the existing {x.id}"
    say(f"identical request on C: job {x.id}, cached: true")

    slow = cluster.slow
    cluster.submit(a, slow)
    cluster.wait_status(b, slow, {"running"}, timeout=120)
    r = cluster.http.delete(f"{b.url}/v1/jobs/{slow.id}", timeout=HTTP_TIMEOUT)
    assert r.status_code == 204, f"DELETE {slow.id} through B: {r.status_code} {r.text[:300]}"
    cluster.wait_status(c, slow, {"canceled"}, timeout=60)
    say(f"{slow.name} ({slow.id}): submitted to A, running, canceled through B, canceled as seen from C")


def test_killed_instance_job_is_reclaimed_after_its_lease(cluster):
    big = cluster.big
    cluster.submit(cluster.instances[1], big)
    rest = [j for j in cluster.jobs[9:] if j is not big]
    # A few more over all three while the big one starts: the victim may hold some of them too.
    before_kill, after_kill = rest[:6], rest[6:]
    for n, job in enumerate(before_kill):
        cluster.submit(cluster.instances[n % 3], job)
    victim = cluster.wait_event("started", big, timeout=120)
    status = cluster.get(cluster.other(victim), big.id)["status"]
    if status != "running" or big.id in victim.events("succeeded"):
        pytest.fail(f"{big.name} was {status} before its instance could be killed: it must run for longer")
    os.kill(victim.pid, signal.SIGKILL)
    killed_at = time.monotonic()
    victim.alive = False
    cluster.victim = victim
    deadline = time.monotonic() + 10
    while not port_closed(victim.url):
        assert time.monotonic() < deadline, f"{victim.name} still accepts connections 10 s after kill -9"
        time.sleep(0.1)
    say(f"{big.name} ({big.id}) started on {victim.name}; kill -9 {victim.name} (pid {victim.pid})")

    survivors = cluster.alive()
    for n, job in enumerate(after_kill):
        cluster.submit(survivors[n % len(survivors)], job)
    say(f"submitted {len(before_kill)} jobs before the kill and {len(after_kill)} to the survivors after it")

    # Reclaimed by a survivor once the lease (renewed at most LEASE_S before the kill) runs out.
    reclaimer = None
    deadline = time.monotonic() + LEASE_S + 120
    while reclaimer is None:
        for inst in survivors:
            if big.id in inst.events("started"):
                reclaimer = inst
        assert time.monotonic() < deadline, f"no survivor started {big.name} ({big.id}) within {LEASE_S + 120:.0f} s of the kill"
        time.sleep(0.1)
    say(f"{reclaimer.name} started {big.name} {time.monotonic() - killed_at:.1f} s after the kill (lease {LEASE_S:g} s)")
    final = cluster.wait_status(reclaimer, big, {"succeeded"}, timeout=240)
    assert big.id not in victim.events("succeeded"), f"the killed {victim.name} logged {big.name} as succeeded"
    say(f"{big.name} succeeded on {reclaimer.name} ({final['status']})")


def test_every_job_succeeds_exactly_once_with_the_reference_bytes(cluster):
    survivors = cluster.alive()
    deadline = time.monotonic() + 240
    pending = list(cluster.jobs)
    while pending:
        assert time.monotonic() < deadline, f"not finished within 240 s: {[j.name for j in pending]}"
        still = []
        for job in pending:
            status = cluster.get(survivors[0], job.id)
            if status["status"] not in TERMINAL:
                still.append(job)
            elif status["status"] != "succeeded":
                pytest.fail(f"{job.name} ({job.id}) ended {status['status']}: {status}")
        pending = still
        if pending:
            time.sleep(0.5)
    say(f"all {len(cluster.jobs)} jobs succeeded")

    succeeded = cluster.events("succeeded")
    wrong = {j.name: succeeded[j.id] for j in cluster.jobs if succeeded[j.id] != 1}
    assert not wrong, f"`job succeeded` lines per job across all logs, expected exactly 1: {wrong}"
    assert succeeded[cluster.slow.id] == 0, f"the canceled {cluster.slow.name} was logged as succeeded"
    later = cluster.get(survivors[0], cluster.slow.id)["status"]
    assert later == "canceled", f"the canceled {cluster.slow.name} is {later} by the end (reclaimed after its cancel?)"
    say("each job logged `job succeeded` exactly once across the three logs")

    for job in cluster.jobs:
        reference = cluster.refs[job.name].result(timeout=300).read_bytes()
        via = cluster.other(job.submitted_to)
        got = cluster.result(via, job)
        if got != reference:
            detail = ""
            try:
                import io
                a, b = np.load(io.BytesIO(got)), np.load(io.BytesIO(reference))
                detail = f"shapes {a.shape} vs {b.shape}"
                if a.shape == b.shape:
                    detail += f", max |diff| {np.nanmax(np.abs(a.astype('f8') - b.astype('f8'))):.3g}"
            except Exception as e:  # the download may not even be a .npy
                detail = f"({e})"
            pytest.fail(f"{job.name} ({job.id}) from {via.name}: {len(got)} bytes differ from `hypermnf run` ({len(reference)} bytes): {detail}")
    say(f"all {len(cluster.jobs)} results equal `hypermnf run` byte for byte")


def test_delete_leaves_no_object_in_the_bucket(cluster):
    bucket, _, _prefix = os.environ["HYPERMNF_TEST_S3_URL"].removeprefix("s3://").partition("/")
    s3 = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"], region_name=os.environ["AWS_REGION"],
                      config=Config(s3={"addressing_style": "path"}, connect_timeout=5, read_timeout=30,
                                    retries={"max_attempts": 3}))

    def keys_of(job_id: str) -> list[str]:
        keys = []
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
            keys += [o["Key"] for o in page.get("Contents", []) if job_id in o["Key"]]
        return keys

    job = cluster.jobs[1]  # not the one of the identical request
    before = keys_of(job.id)
    assert before, f"no object in s3://{bucket} names {job.name}'s id {job.id}: nothing to check DELETE against"
    via = cluster.other(job.submitted_to)
    r = cluster.http.delete(f"{via.url}/v1/jobs/{job.id}", timeout=HTTP_TIMEOUT)
    assert r.status_code == 204, f"DELETE {job.id} through {via.name}: {r.status_code} {r.text[:300]}"
    for inst in cluster.alive():
        r = cluster.http.get(f"{inst.url}/v1/jobs/{job.id}", timeout=HTTP_TIMEOUT)
        assert r.status_code == 404, f"{inst.name} still answers the deleted job {job.id}: {r.status_code}"
    deadline, left = time.monotonic() + 15, before
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = keys_of(job.id)
    assert not left, f"15 s after DELETE of {job.id}, the bucket still holds {left}"
    say(f"DELETE {job.name} through {via.name}: its {len(before)} objects are gone from s3://{bucket}")
