#!/usr/bin/env bash
# End-to-end tests: start `specula serve` and drive it with the official openai npm client.
# Argument: the specula binary. Filled in by the server work; until then there is nothing to run.
set -euo pipefail
echo "e2e: no end-to-end tests yet"
