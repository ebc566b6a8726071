#!/usr/bin/env bash
# Configures and builds specula into build/ (CUDA too when nvcc is found).
# Arguments name targets to build (default: all). BUILD_DIR and SPECULA_BUILD_JOBS override the
# defaults; CMAKE_ARGS adds configure options (e.g. -DSPECULA_CUDA=OFF).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
JOBS=${SPECULA_BUILD_JOBS:-$(nproc)}
# nvcc is often installed outside PATH.
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE="${CMAKE_BUILD_TYPE:-RelWithDebInfo}" ${CMAKE_ARGS:-} >/dev/null
if [ $# -gt 0 ]; then
  cmake --build "$BUILD_DIR" -j "$JOBS" --target "$@"
else
  cmake --build "$BUILD_DIR" -j "$JOBS"
fi
