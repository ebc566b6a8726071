#!/usr/bin/env bash
# On the GPU machine: builds tools/gpu/synccheck_clusters.cu with its nvcc and runs it under
# compute-sanitizer synccheck over 2, 8, 64 and 200 rows of 16 blocks, with and without
# thread-block clusters; prints each run's error count ($OUT/synccheck_clusters.txt).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$(pwd)/.gpu/out}
mkdir -p "$OUT"
nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
bin=$(mktemp -d)/synccheck_clusters
"$nvcc" -O2 -std=c++20 -arch=sm_90 -lineinfo -Isrc tools/gpu/synccheck_clusters.cu -o "$bin" || exit 1
for rows in 2 8 64 200; do
  for mode in plain clustered; do
    "$sanitizer" --tool synccheck --print-limit 1 "$bin" "$rows" "$mode" > "$OUT/synccheck_${rows}_$mode.log" 2>&1
    echo "$rows rows, $mode: $(grep -oE 'ERROR SUMMARY: [0-9]+ errors?' "$OUT/synccheck_${rows}_$mode.log" | head -1)"
  done
done | tee "$OUT/synccheck_clusters.txt"
