"""A campaign on the cluster: a pooled batch of cubes that lie in the cluster's Garage bucket (put there
by this test with boto3, never through the service), named by `s3://` reference, spread over three
`hypermnf serve` instances sharing one PostgreSQL job store, with one instance kill -9ed while the
batch runs. scripts/cluster-test.sh starts a fresh set of instances for it (with `--input-bucket`) and
runs this file after tests/cluster/test_cluster.py.

Checked: every member job ends `succeeded`, logged `job succeeded` exactly once across all the
instances' logs (the killed one's included); the members ran on more than one instance; each member's
components are byte for byte what `hypermnf run --system` writes with the batch's exported system;
DELETE of the batch leaves no object of the batch or of its jobs in the bucket (the inputs stay).
Every wait has a deadline.
"""

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import boto3
import numpy as np
import pytest
import requests
from botocore.config import Config

LEASE_S = float(os.environ.get("HYPERMNF_CLUSTER_LEASE_S", "5"))
UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
ANSI = re.compile(r"\x1b\[[0-9;]*m")
HTTP_TIMEOUT = (5, 120)
N_CUBES = 9


def say(msg: str) -> None:
    print(f"   {time.strftime('%H:%M:%S')} {msg}", file=sys.stderr, flush=True)


def events(log: Path, what: str) -> list[str]:
    """Job ids of the log lines `<what> ... job=<id>` (ANSI colours stripped)."""
    found = []
    pattern = re.compile(rf"\b{what}\b")
    for line in ANSI.sub("", log.read_text(errors="replace")).splitlines():
        if pattern.search(line):
            found += re.findall(rf"\bjob=\"?({UUID})", line)
    return found


def cube(seed: int, lines: int, samples: int, bands: int) -> np.ndarray:
    """A smooth low-rank signal plus noise on an offset of 1000, int16 (no zeros, no wrap-around)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:lines, 0:samples].astype(np.float32) / max(lines, samples)
    out = np.full((lines, samples, bands), 1000.0, np.float32)
    for _ in range(6):
        fy, fx = rng.uniform(0.5, 4.0, 2)
        wave = np.sin(2 * np.pi * (fy * y + fx * x) + rng.uniform(0, 2 * np.pi))
        out += 300.0 * (wave[:, :, None] + 1.0) * rng.uniform(0.2, 1.0, bands)[None, None, :]
    out += rng.normal(0.0, 8.0, out.shape)
    return np.round(out).astype("<i2")


@pytest.fixture(scope="module")
def cluster():
    instances = json.loads(Path(os.environ["HYPERMNF_CLUSTER_FILE"]).read_text())
    for inst in instances:
        inst["log"] = Path(inst["log"])
    return instances


@pytest.fixture(scope="module")
def s3():
    return boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"], region_name=os.environ["AWS_REGION"],
                        config=Config(s3={"addressing_style": "path"}, connect_timeout=5, read_timeout=60,
                                      retries={"max_attempts": 3}))


def test_a_pooled_batch_by_reference_survives_a_killed_instance(cluster, s3):
    bucket, _, prefix = os.environ["HYPERMNF_TEST_S3_URL"].removeprefix("s3://").partition("/")
    work = Path(os.environ["HYPERMNF_CLUSTER_WORK"]) / "campaign"
    work.mkdir(parents=True, exist_ok=True)
    http = requests.Session()
    a, b, c = cluster

    # The campaign, in the bucket, beside (not under) the servers' own prefix.
    paths, hrefs = [], []
    for i in range(N_CUBES):
        path = work / f"line{i:02d}.npy"
        np.save(path, cube(7000 + i, 360 + 8 * i, 300, 48))
        key = f"campaign-{os.getpid()}/line{i:02d}.npy"
        s3.upload_file(str(path), bucket, key)
        paths.append(path)
        hrefs.append(f"s3://{bucket}/{key}")
    say(f"{N_CUBES} cubes put in s3://{bucket}/campaign-{os.getpid()}/")

    r = http.post(f"{a['url']}/v1/batches", timeout=HTTP_TIMEOUT,
                  json={"inputs": [{"href": h} for h in hrefs], "statistics": "pooled",
                        "params": {"components": 5, "backend": "cpu"}})
    assert r.status_code == 201, f"POST /v1/batches to A: {r.status_code} {r.text[:500]}"
    batch = r.json()
    members = [j["id"] for j in batch["jobs"]]
    say(f"pooled batch {batch['id']} of {len(members)} jobs created on A")

    # Kill -9 an instance other than A once it has started one of the members (statistics or projection).
    deadline = time.monotonic() + 120
    victim = None
    while victim is None:
        for inst in (b, c):
            started = set(events(inst["log"], "job started"))
            if started & set(members):
                victim = inst
                break
        assert time.monotonic() < deadline, "neither B nor C started a member of the batch within 120 s"
        time.sleep(0.02)
    doc = http.get(f"{a['url']}/v1/batches/{batch['id']}", timeout=HTTP_TIMEOUT).json()
    assert doc["status"] != "succeeded", f"the batch ended before an instance could be killed: {doc}"
    os.kill(victim["pid"], signal.SIGKILL)
    say(f"kill -9 {victim['name']} (pid {victim['pid']}) while the batch is {doc['status']} ({doc['counts']})")

    # The survivors finish it: reclaimed members once their leases lapse.
    deadline = time.monotonic() + LEASE_S + 240
    while True:
        doc = http.get(f"{a['url']}/v1/batches/{batch['id']}", timeout=HTTP_TIMEOUT).json()
        if doc["status"] in ("succeeded", "failed", "canceled"):
            break
        assert time.monotonic() < deadline, f"the batch did not finish within {LEASE_S + 240:.0f} s of the kill: {doc}"
        time.sleep(0.2)
    assert doc["status"] == "succeeded", f"the batch ended {doc['status']}: {json.dumps(doc)[:2000]}"
    say(f"batch succeeded: {doc['counts']}")

    # Every member succeeded exactly once, across every instance's log (the killed one's too).
    succeeded = Counter(j for inst in cluster for j in events(inst["log"], "job succeeded"))
    twice = {j: n for j, n in succeeded.items() if j in members and n != 1}
    missing = [j for j in members if succeeded[j] == 0]
    assert not twice and not missing, f"members succeeded more than once {twice} or never {missing}"
    ran_on = {inst["name"] for inst in cluster for j in members if j in events(inst["log"], "job started")}
    assert len(ran_on) >= 2, f"the batch ran on {sorted(ran_on)} only"
    say(f"each member succeeded once; members ran on {sorted(ran_on)}")

    # Each member is the batch's exported system applied to its cube (hypermnf run --system).
    r = http.get(f"{b['url'] if victim is c else c['url']}/v1/batches/{batch['id']}/system", timeout=HTTP_TIMEOUT)
    assert r.status_code == 200, f"GET the batch's system: {r.status_code} {r.text[:300]}"
    system = work / "system.json"
    system.write_bytes(r.content)
    for i, (job, path) in enumerate(zip(members, paths)):
        out = work / f"line{i:02d}-cli.npy"
        p = subprocess.run([os.environ["HYPERMNF_BIN"], "run", str(path), "--out", str(out), "--components", "5",
                            "--backend", "cpu", "--system", str(system)], capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, f"hypermnf run --system on {path.name}: {p.stderr[-2000:]}"
        got = http.get(f"{a['url']}/v1/jobs/{job}/result", timeout=HTTP_TIMEOUT)
        assert got.status_code == 200, f"result of member {i}: {got.status_code}"
        assert got.content == out.read_bytes(), f"member {i} ({job}) differs from hypermnf run --system"
    say(f"all {len(members)} members equal hypermnf run --system with the exported pooled system")

    # DELETE leaves nothing of the batch or its jobs; the inputs are the user's and stay.
    def keys(*needles: str) -> list[str]:
        found = []
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=f"{prefix}/" if prefix else ""):
            found += [o["Key"] for o in page.get("Contents", []) if any(n in o["Key"] for n in needles)]
        return found

    before = keys(batch["id"], *members)
    assert before, "no object of the batch in the bucket: nothing to check DELETE against"
    r = http.delete(f"{a['url']}/v1/batches/{batch['id']}", timeout=HTTP_TIMEOUT)
    assert r.status_code == 204, f"DELETE the batch: {r.status_code} {r.text[:300]}"
    deadline, left = time.monotonic() + 15, before
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = keys(batch["id"], *members)
    assert not left, f"15 s after DELETE the bucket still holds {left}"
    inputs = s3.list_objects_v2(Bucket=bucket, Prefix=f"campaign-{os.getpid()}/").get("KeyCount", 0)
    assert inputs == N_CUBES, f"the inputs must stay: {inputs} of {N_CUBES} left"
    say(f"DELETE: the batch's {len(before)} objects are gone; the {N_CUBES} inputs stay")
