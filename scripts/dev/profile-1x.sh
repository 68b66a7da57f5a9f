#!/usr/bin/env bash
# Development profile of the 1x GPU pipeline on the GPU host (after gpu-pack): host timings
# (RUST_LOG=hypermnf::timing=debug) and per-kernel device durations (ncu, one metric, summed by name).
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp}
bin=.gpu/bin/hypermnf
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
RUST_LOG=hypermnf::timing=debug $bin bench gpu --scales 1 --runs 5 --warmup 2 --no-cpu >"$out/timing.txt" 2>&1
sed 's/\x1b\[[0-9;]*m//g' "$out/timing.txt" | grep -E "statistics chunk|statistics wall|eigen step|output pass|^\| 1x" | tail -40
if command -v ncu >/dev/null; then
  ncu --metrics gpu__time_duration.sum --csv $bin bench gpu --scales 1 --runs 1 --warmup 1 --no-cpu >"$out/ncu.csv" 2>"$out/ncu.err"
  python3 - "$out/ncu.csv" <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
hdr = rows[0]; rows = rows[1:]
ki = hdr.index("Kernel Name"); vi = hdr.index("Metric Value"); ui = hdr.index("Metric Unit")
agg = collections.defaultdict(list)
for r in rows:
    try: v = float(r[vi].replace(",", ""))
    except ValueError: continue
    if r[ui] == "nsecond": v /= 1e3
    elif r[ui] == "msecond": v *= 1e3
    agg[r[ki].split("(")[0]].append(v)
print("| kernel | launches | total us | mean us |")
for k, v in sorted(agg.items(), key=lambda kv: -sum(kv[1])):
    print(f"| {k[:60]} | {len(v)} | {sum(v):.0f} | {sum(v)/len(v):.1f} |")
PY
fi
command -v nsys && nsys --version
