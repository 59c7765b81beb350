#!/usr/bin/env bash
# One device call of test-model training (docs/test-model.md): resumes from the checkpoint
# carried in at .dev/train-niah/ckpt/ when there is one, trains until --budget seconds (all
# included) are nearly spent, and leaves in $OUT: train.log, ckpt/ckpt.partNN, model.gguf,
# eval.json, history.json (7 files: the tool returns at most 8, each <= 16 MiB).
#   run(command="tools/train-niah/device-run.sh --budget 560", carry=[".dev/train-niah", ".dev/deps"], timeout_s=600)
# --smoke: afterwards, resume the checkpoint just written for 10 steps in a scratch folder
# (proves resume works; its log is appended to train.log). Other arguments go to train.py.
set -uo pipefail
cd "$(dirname "$0")/../.."
start=$(date +%s)
out=${OUT:-out/train-niah}
mkdir -p "$out"
budget=540
smoke=0
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --budget) budget=$2; shift 2 ;;
    --smoke) smoke=1; shift ;;
    *) args+=("$1"); shift ;;
  esac
done
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader || true
python3 -c 'import torch, sys; print("torch", torch.__version__, "cuda", torch.cuda.is_available(), "python", sys.version.split()[0])'

# The data tool: the binary carried in (built on a Debian x86-64 machine with static
# libstdc++), else a build here with the carried .dev/deps for nlohmann-json.
tool=.dev/train-niah/bin/niah-train-data
if ! "$tool" check --vocab tools/train-niah/vocab.json >"$out/train.log" 2>&1; then
  echo "no usable carried data tool; building it"
  prefix=()
  [ -d .dev/deps ] && prefix=(-DCMAKE_PREFIX_PATH="$PWD/.dev/deps")
  if ! { cmake -S tools/niah-train-data -B build-train-device -G Ninja "${prefix[@]}" &&
         ninja -C build-train-device -j16 niah-train-data; } >/tmp/niah-build.log 2>&1; then
    echo "BUILD FAILED"; grep -E "error|Error" /tmp/niah-build.log | head -20; exit 1
  fi
  tool=build-train-device/bin/niah-train-data
  "$tool" check --vocab tools/train-niah/vocab.json >"$out/train.log" 2>&1 || { cat "$out/train.log"; exit 1; }
fi
tail -2 "$out/train.log"

resume=()
ls .dev/train-niah/ckpt/ckpt.part00 >/dev/null 2>&1 && resume=(--resume .dev/train-niah/ckpt)
used=$(( $(date +%s) - start ))
python3 tools/train-niah/train.py --tool "$tool" --out-dir "$out" "${resume[@]}" \
  --time-budget $(( budget - used - (smoke ? 25 : 0) )) "${args[@]}"
rc=$?
if [ $smoke = 1 ] && [ $rc = 0 ]; then
  step=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[-1]["step"])' "$out/history.json" 2>/dev/null || echo 0)
  python3 tools/train-niah/train.py --tool "$tool" --out-dir /tmp/resume-test --resume "$out/ckpt" \
    "${args[@]}" --max-steps $(( step + 10 )) --time-budget 60 --reserve 0 --first-eval 0 --eval-every 100000 \
    --eval-lengths 512 --eval-depths 1 --final-depths 1 >/dev/null 2>&1
  { echo "--- resume test (scratch folder, outputs discarded) ---"; cat /tmp/resume-test/train.log; } >>"$out/train.log"
  tail -4 /tmp/resume-test/train.log
fi
echo "device-run: $(( $(date +%s) - start )) s, exit $rc"
exit $rc
