#!/usr/bin/env bash
# tools/power-trace.sh against a stand-in nvidia-smi: the summary counts only busy samples (over
# a quarter of the limit), reads throttle bit 0x4 as the power cap, and the command's output and
# exit status pass through; bad flags are refused.
set -u
script="$1"
fake=$(mktemp -d)
trap 'rm -rf "$fake"' EXIT
cat >"$fake/nvidia-smi" <<'SMI'
#!/usr/bin/env bash
case "$*" in
  *power.limit*) echo "700.00" ;;
  *) printf '71.0, 1980, 0x0000000000000000\n690.5, 1410, 0x0000000000000004\n697.0, 1380, 0x0000000000000005\n450.0, 1980, 0x0000000000000000\n'
     exec sleep 30 ;;
esac
SMI
chmod +x "$fake/nvidia-smi"
fail() { echo "FAILED: $*"; exit 1; }

out=$(PATH="$fake:$PATH" "$script" -o "$fake/raw.csv" -- sh -c 'sleep 0.5; echo payload; exit 3' 2>"$fake/err")
status=$?
[ "$status" = 3 ] || fail "exit status $status, expected the command's 3"
[ "$out" = payload ] || fail "stdout '$out'"
grep -q "3 busy samples: 612 W mean of 700.00 W, SM clock 1590 MHz mean (1380-1980), power-capped in 67%" "$fake/err" ||
  fail "summary: $(cat "$fake/err")"
[ "$(wc -l <"$fake/raw.csv")" = 4 ] || fail "raw samples not kept"

"$script" -i 5 -- true 2>/dev/null && fail "-i 5 accepted"
"$script" -i x -- true 2>/dev/null && fail "-i x accepted"
"$script" --bogus -- true 2>/dev/null && fail "unknown flag accepted"
"$script" 2>/dev/null && fail "no command accepted"
echo "power-trace check passed"
