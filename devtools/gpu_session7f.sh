# Session 7, issue 3, check 2 of 2 (after the verdict's Inf rule): the fuzz run again, the GPU tests
# of the Triton kernels that reach the Gluon forward, and the Gluon forward's mutants. ~9 min.
. devtools/device_setup.sh
step() { local s=$(date +%s); timeout -s TERM "$@"; echo "  exit $? after $(( $(date +%s) - s )) s"; }
echo "== fuzz triton 10000"; step 245 python3 -m faverify fuzz --kernel triton --iters 10000 --dtype bf16,fp16 \
  --mode both --no-db --json $OUT/fuzz_triton.json > $OUT/fuzz.log 2>&1; grep -A4 "== Summary" $OUT/fuzz.log
grep -E "warm-up|Failures|minimal case|reason" $OUT/fuzz.log | head -8
echo "== tests"; step 140 python3 -m pytest -q -m "not slow" -p no:cacheprovider property_tests/test_triton_kernels.py \
  -k "hopper or init_modes or strided_inputs or deterministic or no_keys or descriptors" > $OUT/tests.log 2>&1; tail -4 $OUT/tests.log
echo "== mutants of the Gluon forward"; step 140 python3 -m faverify mutants --iters 100 --json $OUT/mutants.json \
  --only ws-no-neg-inf-guard,ws-no-rescale,ws-causal-top-left,ws-tail-tile-unmasked,ws-consumer-rows > $OUT/mutants.log 2>&1
grep -v -i "warn" $OUT/mutants.log | tail -14
