# What session 8 owes (docs/measurements.md, "Session 8"): the fuzz run to its end on the final Gluon
# forward (session 8's stopped at 9185 cases, 0 failed, on the script's own time limit), and the memory
# test on it. One H200; about 6 minutes. Then, in a second call, the GPU run of the slow mutants test:
#   python3 -m pytest -q -p no:cacheprovider -m slow property_tests/test_mutants.py
. devtools/device_setup.sh
step() { local s=$(date +%s); timeout -s TERM "$@"; echo "  exit $? after $(( $(date +%s) - s )) s"; }
echo "== fuzz triton 10000"; step 420 python3 -m faverify fuzz --kernel triton --iters 10000 --dtype bf16,fp16 \
  --mode both --no-db --json $OUT/fuzz_triton.json > $OUT/fuzz.log 2>&1; grep -A4 "== Summary" $OUT/fuzz.log
grep -E "warm-up|code path|Failures|minimal case|reason" $OUT/fuzz.log | head -8
echo "== memory"; step 120 python3 -m pytest -q -p no:cacheprovider property_tests/test_memory.py -s > $OUT/mem.log 2>&1
grep -E "peak|passed|failed" $OUT/mem.log
