#!/usr/bin/env bash
# The README's run command: installs dependencies, builds, and serves the embedded default model
# (models/specula-tiny) on http://localhost:8000 with the OpenAI API. Extra arguments go to
# `specula serve`. SPECULA_SKIP_INSTALL=1 skips the package installation (the test of this
# command, tests/e2e/run_command.sh, runs after scripts/test.sh has installed everything).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -n "${SPECULA_SKIP_INSTALL:-}" ] || scripts/install-deps.sh
scripts/build.sh specula
exec "${BUILD_DIR:-build}/src/specula" serve "$@"
