#!/usr/bin/env bash
# Installs the Debian 12 packages spillway builds and tests with, only those missing.
# CUDA comes from the toolkit at /usr/local/cuda when present (the CPU engine builds without it).
set -euo pipefail
packages=(build-essential cmake ninja-build pkg-config libgtest-dev libgmock-dev nlohmann-json3-dev
          clang libclang-rt-dev python3)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# Node.js and npm (the tokenizer tests' independent reference) may come from another
# Debian-format repository (e.g. nodesource ships npm inside its nodejs); only install
# Debian's when the commands are absent, since Debian's npm conflicts with those builds.
if ! command -v node >/dev/null; then missing+=(nodejs); fi
if ! command -v npm >/dev/null; then missing+=(npm); fi
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "install-deps: installing ${missing[*]}"
sudo_cmd=""
if [ "$(id -u)" -ne 0 ]; then sudo_cmd="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$sudo_cmd apt-get update -qq
$sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}"
