#!/usr/bin/env bash
# Installs everything specula needs to build, run and test, from Debian packages (and the npm
# registry for the end-to-end tests' official `openai` client). Safe to run repeatedly.
set -euo pipefail

PKGS=(
  build-essential cmake ninja-build pkg-config git
  libopenblas-dev      # CPU GEMMs
  libpcre2-dev         # tokenizer pre-tokenizer regexes (\p{L}, lookahead) in UTF mode
  libutf8proc-dev      # NFC normalisation
  nlohmann-json3-dev   # config.json, tokenizer.json, OpenAI request bodies
  libcpp-httplib-dev   # HTTP server
  libcli11-dev         # command line
  libfmt-dev libspdlog-dev
  libxxhash-dev        # prefix-cache block hashes
  libgtest-dev libgmock-dev libbenchmark-dev
  python3              # tools/check_layout.py (the `layout` test)
  clang libclang-rt-dev libomp-dev  # the `fuzz` test: libFuzzer, ASan, UBSan (tests/fuzz/run.sh)
  nodejs curl          # end-to-end tests drive the server with the official openai npm client
)

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "install-deps: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
# npm may come with Node.js from elsewhere; take Debian's only when there is none.
if ! command -v npm >/dev/null; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends npm
fi
