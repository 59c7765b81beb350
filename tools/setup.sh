#!/usr/bin/env bash
# The README's first command: install what is missing, build, and run the main job on the
# built-in default (a small synthetic model: its info, then the KV plan on the H200 profile).
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install-deps.sh
tools/build.sh build
mkdir -p out
bin=build/bin/spillway
$bin make-model --preset tiny --wtype q8_0 --seed 1 -o out/tiny.gguf
$bin info -m out/tiny.gguf -c 4096
$bin plan -m out/tiny.gguf -c 4096 --profile profiles/h200-sxm.json
$bin run -m out/tiny.gguf -p "The quick brown fox" -n 32 --temp 0
