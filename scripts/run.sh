#!/usr/bin/env bash
# The README's run command: installs dependencies, builds, and serves the embedded default model
# (models/specula-tiny) on http://localhost:8000 with the OpenAI API. Extra arguments go to
# `specula serve`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh specula
exec "${BUILD_DIR:-build}/specula" serve "$@"
