# Session 3, one H200: issue 2's GPU run for the flash and memory-efficient backends, 10000 cases each,
# with the cases now drawn in a thread while the workers run; 6 workers (the default) against 12 for
# flash. Time-boxed steps writing under $OUT; ~5.5 min (the session's last device minutes).
. devtools/device_setup.sh
step() { local s=$(date +%s); timeout -s TERM "$@"; echo "  exit $? after $(( $(date +%s) - s )) s"; }
for spec in "sdpa-flash 6" "sdpa-flash 12" "sdpa-efficient 12"; do
  set -- $spec
  echo "== $1 workers $2"; step 105 python3 -m faverify fuzz --kernel $1 --iters 10000 --dtype bf16,fp16 --workers $2 \
    --no-db --json $OUT/$1-$2.json > $OUT/$1-$2.log 2>&1
  grep -E "^$1 |^== Failures|interrupted=True" $OUT/$1-$2.log | head -3
  grep -E "^$1: " $OUT/$1-$2.log | head -8
done
