# Session 9, check 2: the Gluon forward's sizes left unspecialized (one compile per variant whatever the
# sizes): the compile-count test and the Gluon FP64 test, the fuzz run (same command as check 1:
# 274 s before), the untuned bench (speed unchanged?), the mutants with reached counted per case. ~9 min.
. devtools/device_setup.sh
t0=$(date +%s)
step() { local s=$(date +%s); timeout -s TERM "$@"; echo "  exit $? after $(( $(date +%s) - s )) s"; }
echo "== tests"; step 100 python3 -m pytest -q -p no:cacheprovider -rs property_tests/test_triton_kernels.py \
  -k "one_compile or hopper_forward_is_right" > $OUT/tests.log 2>&1; grep -E "passed|failed|Error|assert" $OUT/tests.log | head -8
echo "== fuzz triton 10000"; step 320 python3 -m faverify fuzz --kernel triton --iters 10000 --dtype bf16,fp16 \
  --mode both --no-db --json $OUT/fuzz_triton.json > $OUT/fuzz.log 2>&1; grep -A4 "== Summary" $OUT/fuzz.log
grep -E "warm-up|code path|Failures|minimal case" $OUT/fuzz.log | head -6
echo "== bench"; step 140 python3 -m faverify bench --kernel triton --headdims 64,128 --seqlens 4096,16384 \
  --dtype bf16,fp16 --no-tune --json $OUT/bench.json > $OUT/bench.log 2>&1; grep -v -i warn $OUT/bench.log | tail -30
left=$(( 560 - ($(date +%s) - t0) ))
echo "== mutants (limit $left s)"; step $left python3 -m faverify mutants --iters 60 --shrink-budget 5 --json $OUT/mutants.json > $OUT/mutants.log 2>&1
grep -v -i warn $OUT/mutants.log | grep -E "^mutant |killed|survived|error" | grep -v "^mutants:" | tail -24
