#!/usr/bin/env bash
# The README's test command: installs dependencies, builds, fetches the real tokenizers, runs
# every test (unit tests per layer, then end-to-end tests through the openai npm client).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
scripts/fetch_tokenizers.sh
cd "${BUILD_DIR:-build}"
ctest --output-on-failure "$@"
