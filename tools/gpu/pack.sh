#!/usr/bin/env bash
# Builds specula with CUDA (sm_90) here and packs what the GPU machine needs into .gpu/ (ignored by
# git; name it in the device tool's `carry`): stripped binaries in .gpu/bin and the few shared
# libraries that the GPU machine's Ubuntu image lacks (or has at another soname) in .gpu/lib.
# Usage: tools/gpu/pack.sh [targets...]   (default: specula, every test binary, cuda_roofline)
#   tools/gpu/pack.sh specula test_backend_cuda test_sampling_cuda test_engine_cuda test_app_cuda cuda_roofline
#                                                                          (what run_all.sh runs)
set -euo pipefail
cd "$(dirname "$0")/../.."
export BUILD_DIR=${BUILD_DIR:-build-gpu}
export CMAKE_ARGS="${CMAKE_ARGS:-} -DSPECULA_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90"
targets=("$@")
scripts/build.sh "${targets[@]}"
rm -rf .gpu/bin .gpu/lib
mkdir -p .gpu/bin .gpu/lib
for f in "$BUILD_DIR"/src/specula "$BUILD_DIR"/tests/test_* "$BUILD_DIR"/tools/gpu/cuda_roofline; do
  [ -f "$f" ] && [ -x "$f" ] || continue
  if [ ${#targets[@]} -gt 0 ]; then
    keep=0
    for t in "${targets[@]}"; do [ "$(basename "$f")" = "$t" ] && keep=1; done
    [ $keep = 1 ] || continue
  fi
  strip -o .gpu/bin/"$(basename "$f")" "$f"
done
# cupti_gaps (named as a target): the CUPTI gap library and the libcupti it was linked with.
for t in "${targets[@]}"; do
  [ "$t" = cupti_gaps ] || continue
  cp "$BUILD_DIR"/tools/gpu/libcupti_gaps.so .gpu/lib/
  ldd "$BUILD_DIR"/tools/gpu/libcupti_gaps.so | awk '/libcupti\.so/ {print $3}' | xargs -r -I{} cp -L {} .gpu/lib/
done
# PACK_BASELINE=path/to/specula: another build packed as specula-baseline, for tools/gpu/ab_spec.sh.
if [ -n "${PACK_BASELINE:-}" ]; then
  strip -o .gpu/bin/specula-baseline "$PACK_BASELINE"
  echo "${PACK_BASELINE_DESC:-$PACK_BASELINE}" > .gpu/baseline.txt
fi
# Libraries from Debian packages that the Ubuntu 24.04 GPU image lacks or has at another soname.
# (OpenBLAS, libgomp, libgfortran and the CUDA libraries are present there.)
for bin in .gpu/bin/*; do
  ldd "$bin" | awk '/=> \// {print $3}'
done | sort -u | grep -E 'libspdlog|libfmt|libutf8proc|libcpp-httplib|libpcre2-8|libxxhash' |
  while read -r lib; do cp -L "$lib" .gpu/lib/; done
# Extras for tools/gpu/run_all.sh, compressed (the carry limit is 64 MiB): the real tokenizers the
# benchmarks detokenise with (scripts/fetch_tokenizers.sh puts them in .cache/tokenizers) and the
# e2e suite's node_modules (the GPU machine cannot reach npm). Skipped when absent here.
rm -f .gpu/extras.tar.xz
extras=()
for t in llama3 qwen3; do
  [ -f .cache/tokenizers/$t/tokenizer.json ] && extras+=(--transform "s|^.cache/tokenizers|tokenizers|" .cache/tokenizers/$t)
done
[ -d tests/e2e/node_modules ] && extras+=(--transform "s|^tests/e2e/node_modules|node_modules|" tests/e2e/node_modules)
if [ ${#extras[@]} -gt 0 ] && [ -z "${PACK_NO_EXTRAS:-}" ]; then
  XZ_OPT=-6 tar -cJf .gpu/extras.tar.xz "${extras[@]}"
fi
# The binaries travel xz-compressed (the carry limit counts the tracked tree too); -9's 64 MiB
# window also finds what two builds (specula and specula-baseline) share: 9 MB for both against
# 20 MB at -4. env.sh unpacks them on the GPU machine. PACK_NO_COMPRESS=1 leaves .gpu/bin as it is.
rm -f .gpu/bin.tar.xz
if [ -z "${PACK_NO_COMPRESS:-}" ]; then
  tar -C .gpu -cf - bin | xz -T2 -9 > .gpu/bin.tar.xz
  rm -rf .gpu/bin
fi
# What was built: the commit, and whether the working tree differed from it.
{ git rev-parse HEAD; git status --porcelain -- src tests tools CMakeLists.txt | head -20; } > .gpu/commit.txt
du -sh .gpu
