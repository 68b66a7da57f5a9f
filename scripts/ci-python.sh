#!/usr/bin/env bash
# The Python client's CI: install it (with its test and notebook extras) into a virtualenv, run its pytest
# suite against real `hypermnf serve` processes (the suite starts them), then start one more server and
# execute the example notebook against it with nbclient. Exits non-zero on any failure, including a pytest
# run that collected no test (exit code 5).
# Environment: HYPERMNF_BIN (default: the newest of target/{release,debug}/hypermnf, built with
# `cargo build` if there is none), CI_VENV (default .venv, the project's git-ignored virtualenv), PYTEST_ARGS (extra pytest arguments).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

step() { echo "== ci-python: $*"; }
fail() { echo "ci-python: FAIL: $*" >&2; exit 1; }
# shellcheck source=lib/pytest-env.sh
source scripts/lib/pytest-env.sh

step "pip install ./clients/python[test,notebook]"
hypermnf_venv "./clients/python[test,notebook]"

step "hypermnf binary"
hypermnf_binary
echo "using $HYPERMNF_BIN"

step "pytest clients/python/tests"
# The test extra installs rasterio: the GeoTIFF results' test (cog_to_xarray) fails rather than skips
# without a GDAL binding.
export HYPERMNF_REQUIRE_GDAL_PY=${HYPERMNF_REQUIRE_GDAL_PY:-1}
set +e
# Run from the package directory, so that `import hypermnf` is the installed package, not a source path.
(cd clients/python && "$PY" -m pytest -q -p no:cacheprovider ${PYTEST_ARGS:-} tests)
rc=$?
set -e
case $rc in
    0) ;;
    5) fail "pytest collected no tests" ;;
    *) fail "pytest exited with $rc" ;;
esac

step "notebook clients/python/examples/quickstart.ipynb against a live server"
work=$(mktemp -d)
port=$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$HYPERMNF_BIN" serve --listen "127.0.0.1:$port" --data-dir "$work/data" --input-root "$ROOT/tests/data" \
    >"$work/server.log" 2>&1 &
server_pid=$!
cleanup() {
    kill "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
export HYPERMNF_URL="http://127.0.0.1:$port"
unset HYPERMNF_API_KEY
"$PY" - <<'PY' || { cat "$work/server.log" >&2; fail "the server did not come up"; }
import os, time
import hypermnf
client = hypermnf.Client(timeout=2)
deadline = time.monotonic() + 60
while True:
    try:
        if client.health():
            break
    except hypermnf.HyperMNFError:
        if time.monotonic() > deadline:
            raise
        time.sleep(0.2)
PY
mkdir -p target
"$PY" - "$ROOT/clients/python/examples/quickstart.ipynb" "$ROOT/target/quickstart.executed.ipynb" <<'PY' || { cat "$work/server.log" >&2; fail "the notebook failed"; }
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

source, executed = Path(sys.argv[1]), Path(sys.argv[2])
nb = nbformat.read(source, as_version=4)
NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(source.parent)}}).execute()
images = sum(1 for cell in nb.cells if cell.cell_type == "code" for out in cell.get("outputs", []) if "image/png" in out.get("data", {}))
nbformat.write(nb, executed)
if images < 2:
    sys.exit(f"expected the eigenvalue plot and the RGB image, the notebook produced {images} image(s)")
print(f"notebook executed: {len(nb.cells)} cells, {images} images -> {executed}")
PY

echo "ci-python: all checks passed"
