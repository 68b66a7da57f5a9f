#!/usr/bin/env bash
# On the GPU host: `hypermnf info`, `hypermnf run --backend cuda|cuda-cublas|cpu` on the real cubes, and a
# comparison of the components (per-component correlation, eigenvalues from the JSON metadata).
# Also lists the PTX cache. Exit 1 when a comparison fails.
set -uo pipefail
cd "$(dirname "$0")/.."
[ -x .gpu/bin/hypermnf ] && export PATH="$PWD/.gpu/bin:$PATH"
out=${OUT:-/tmp}/cli
mkdir -p "$out"
hypermnf info
status=0
for cube in salinasA_224_bip_be jasper_ridge_r198_bil abu_beach1_cat_island_bsq; do
  for b in cpu cuda cuda-cublas; do
    hypermnf run "tests/data/$cube.hdr" --backend "$b" --components 10 --out "$out/$cube-$b.npy" 2>"$out/$cube-$b.log" \
      || { echo "run $cube $b failed"; cat "$out/$cube-$b.log"; status=1; }
  done
done
python3 - "$out" <<'PY' || status=1
import json, sys, glob, numpy as np
out = sys.argv[1]
bad = 0
for cube in ["salinasA_224_bip_be", "jasper_ridge_r198_bil", "abu_beach1_cat_island_bsq"]:
    ref = np.load(f"{out}/{cube}-cpu.npy").reshape(-1, 10)
    mref = json.load(open(f"{out}/{cube}-cpu.json"))
    for b in ["cuda", "cuda-cublas"]:
        z = np.load(f"{out}/{cube}-{b}.npy").reshape(-1, 10)
        m = json.load(open(f"{out}/{cube}-{b}.json"))
        ev = np.abs(np.array(m["eigenvalues"][:10]) / np.array(mref["eigenvalues"][:10]) - 1).max()
        ok = np.isfinite(ref[:, 0])
        corr = [np.corrcoef(z[ok, c], ref[ok, c])[0, 1] for c in range(10)]
        print(f"{cube} {b}: device {m['device']!r}, max eigenvalue rel. diff {ev:.2e}, min component corr {min(corr):.6f}")
        bad += ev > 1e-4 or min(corr) < 0.9999
sys.exit(1 if bad else 0)
PY
echo "PTX cache:"; ls -la "${XDG_CACHE_HOME:-$HOME/.cache}/hypermnf" 2>&1 | tail -3
exit $status
