#!/usr/bin/env bash
# On the GPU host after gpu-pack: `hypermnf serve` on its defaults (GPU backend, job cache index in GPU
# memory), a cold job, then right after it reads as succeeded: /metrics must already count its result
# and eigen system, the identical request must be answered by the existing job (200), and a request
# changing only `components` must reuse the statistics (from the device level). Exit 1 otherwise.
set -uo pipefail
cd "$(dirname "$0")/../.."
bin=${HYPERMNF:-.gpu/bin/hypermnf}
data=$(mktemp -d)
log=${OUT:-/tmp}/gpu-service-smoke.log
"$bin" serve --listen 127.0.0.1:18089 --data-dir "$data" >"$log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; rm -rf "$data"' EXIT
python3 - <<'PY'
import io, json, sys, time, urllib.request
import numpy as np

base = "http://127.0.0.1:18089"
for _ in range(300):
    try:
        urllib.request.urlopen(base + "/readyz", timeout=1)
        break
    except Exception:
        time.sleep(0.1)

def call(method, path, body=None):
    req = urllib.request.Request(base + path, data=body, method=method, headers={"content-type": "application/x-npy"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()

def metric(name, level):
    text = call("GET", "/metrics")[1].decode()
    for line in text.splitlines():
        if line.startswith(name + "{") and f'level="{level}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return None

def run(query):
    s, body = call("POST", "/v1/jobs?" + query, npy)
    assert s == 202, (s, body)
    jid = json.loads(body)["id"]
    while True:
        j = json.loads(call("GET", f"/v1/jobs/{jid}")[1])
        if j["status"] not in ("queued", "running"):
            return jid, j
        time.sleep(0.005)

rng = np.random.default_rng(int(time.time()))
cube = (rng.normal(size=(300, 200, 96)) * 200 + 1000).astype(np.int16)
buf = io.BytesIO()
np.save(buf, cube)
npy = buf.getvalue()

fail = 0
first, j = run("components=5")
print("cold job:", j["status"], j.get("backend"), flush=True)
fail |= j["status"] != "succeeded"
entries = (metric("hypermnf_job_cache_entries", "result"), metric("hypermnf_job_cache_entries", "statistics"))
print("entries right after success (result, statistics):", entries)
fail |= entries != (1.0, 1.0)
s, body = call("POST", "/v1/jobs?components=5", npy)
print("identical request:", s, json.loads(body).get("id") == first)
fail |= not (s == 200 and json.loads(body).get("id") == first)
second, j = run("components=3")
md = json.loads(call("GET", f"/v1/jobs/{second}/metadata")[1]) if j["status"] == "succeeded" else {}
print("components=3:", j["status"], "statistics:", md.get("statistics"), "timings:", md.get("timings_ms"))
fail |= (md.get("statistics") or {}).get("reused") is not True
print("index:", [l for l in call("GET", "/metrics")[1].decode().splitlines() if "job_cache" in l and not l.startswith("#")][:12])
sys.exit(1 if fail else 0)
PY
status=$?
grep -iE "job cache ready|error|panick" "$log" | head -5
echo "gpu-service-smoke: exit $status"
exit $status
