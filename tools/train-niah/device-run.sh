#!/usr/bin/env bash
# One device call of test-model training (docs/test-model.md): resumes from the checkpoint
# carried in at .dev/train-niah/ckpt/ when there is one, trains until --budget seconds (all
# included) are nearly spent, and leaves in $OUT: train.log, ckpt/ckpt.partNN, model.gguf,
# eval.json, history.json (7 files: the tool returns at most 8, each <= 16 MiB).
#   run(command="tools/train-niah/device-run.sh --budget 560", carry=[".dev/train-niah", ".dev/deps"], timeout_s=600)
# --smoke: afterwards, resume the checkpoint just written for 10 steps in a scratch folder
# (proves resume works; its log is appended to train.log). Other arguments go to train.py.
# --candidates 'A:ARGS;B:ARGS;...' (a fresh start only): trains each candidate recipe (its
# ARGS added to the others) in parallel on the one GPU for --candidate-seconds, scores each by
# its held-out single-needle niah at 512 and 1k (then its last answer loss), and continues the
# best one for the rest of the budget; their logs come back in candidates.tar.gz. When no
# candidate left chance (niah < 10 and answer loss > --chance-loss), it stops there and saves
# the device time.
# --cooldown-s S: the main run's lr decays over its last S seconds of training (default 60).
set -uo pipefail
cd "$(dirname "$0")/../.."
start=$(date +%s)
out=${OUT:-out/train-niah}
mkdir -p "$out"
budget=540
smoke=0
candidates=""
cand_s=130
chance=2.3
cooldown=60
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --budget) budget=$2; shift 2 ;;
    --smoke) smoke=1; shift ;;
    --candidates) candidates=$2; shift 2 ;;
    --candidate-seconds) cand_s=$2; shift 2 ;;
    --chance-loss) chance=$2; shift 2 ;;
    --cooldown-s) cooldown=$2; shift 2 ;;
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
if [ -n "$candidates" ] && [ ${#resume[@]} = 0 ]; then
  IFS=';' read -ra cands <<<"$candidates"
  n=${#cands[@]}
  pids=()
  for c in "${cands[@]}"; do
    name=${c%%:*}; read -ra cargs <<<"${c#*:}"
    rm -rf "/tmp/cand-$name"
    python3 tools/train-niah/train.py --tool "$tool" --out-dir "/tmp/cand-$name" --work-dir "/tmp/shards-$name" \
      --threads $(( 14 / n > 1 ? 14 / n : 1 )) --time-budget "$cand_s" --reserve 25 --eval-lengths 512,1024 \
      --eval-tasks single_1,single_2,single_3 --final-depths 3 --eval-every 250 "${args[@]}" "${cargs[@]}" \
      >"/tmp/cand-$name.out" 2>&1 &
    pids+=($!)
  done
  wait "${pids[@]}"
  tar -czf "$out/candidates.tar.gz" -C /tmp $(cd /tmp && ls cand-*.out cand-*/train.log cand-*/eval.json cand-*/history.json 2>/dev/null)
  best=$(python3 - "$chance" "${cands[@]}" <<'PY'
import json, sys
chance, best = float(sys.argv[1]), None
for c in sys.argv[2:]:
    name = c.split(":")[0]
    try:
        table = json.load(open("/tmp/cand-%s/eval.json" % name))["table"]
        hist = [h for h in json.load(open("/tmp/cand-%s/history.json" % name)) if "answer_loss" in h]
    except Exception as e:
        print("candidate %s: no result (%r)" % (name, e), file=sys.stderr)
        continue
    score = sum(table.values()) / max(1, len(table))
    loss = hist[-1]["answer_loss"] if hist else 99.0
    print("candidate %s: single-needle niah %.1f, last answer loss %.3f (%s)" % (name, score, loss, hist[-1]["stage"] if hist else "-"), file=sys.stderr)
    if (score >= 10 or loss < chance) and (best is None or (score, -loss) > best[0]):
        best = ((score, -loss), name)
print(best[1] if best else "")
PY
)
  for c in "${cands[@]}"; do [ "${c%%:*}" = "$best" ] && read -ra bestargs <<<"${c#*:}"; done
  if [ -z "$best" ]; then
    echo "no candidate left chance (answer loss >= $chance); stopping"
    cp /tmp/cand-*/train.log "$out/" 2>/dev/null
    echo "device-run: $(( $(date +%s) - start )) s, exit 3"; exit 3
  fi
  echo "continuing candidate $best: ${bestargs[*]}"
  resume=(--resume "/tmp/cand-$best/ckpt")
  args+=("${bestargs[@]}")
fi
used=$(( $(date +%s) - start ))
python3 tools/train-niah/train.py --tool "$tool" --out-dir "$out" "${resume[@]}" \
  --time-budget $(( budget - used - (smoke ? 25 : 0) )) --cooldown-s "$cooldown" "${args[@]}"
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
