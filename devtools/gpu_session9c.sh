# Session 9, check 3: the Gluon forward in two builds (forward_hopper.kernel: seqlens both multiples of 16
# specialized on them, any other pair on nothing; the head counts never). The compile-count test, the Gluon
# FP64 and path tests, a Gluon mutant in a worker; the fuzz run (274 s all specialized, 126 s none);
# the untuned bench; the specialization sweep with the launched choice. ~8 min.
. devtools/device_setup.sh
step() { local s=$(date +%s); timeout -s TERM "$@"; echo "  exit $? after $(( $(date +%s) - s )) s"; }
echo "== tests"; step 110 python3 -m pytest -q -p no:cacheprovider -rs property_tests/test_triton_kernels.py \
  -k "one_compile or hopper_forward_is_right or code_paths or gluon_mutant" \
  property_tests/test_mutants.py::test_a_gluon_mutant_fails_in_a_worker_process > $OUT/tests.log 2>&1
grep -E "passed|failed|Error|assert" $OUT/tests.log | head -8
echo "== fuzz triton 10000"; step 200 python3 -m faverify fuzz --kernel triton --iters 10000 --dtype bf16,fp16 \
  --mode both --no-db --json $OUT/fuzz_triton.json > $OUT/fuzz.log 2>&1; grep -A4 "== Summary" $OUT/fuzz.log
grep -E "warm-up|code path|Failures|minimal case" $OUT/fuzz.log | head -6
echo "== bench"; step 100 python3 -m faverify bench --kernel triton --headdims 64,128 --seqlens 4096,16384 \
  --dtype bf16,fp16 --no-tune --json $OUT/bench.json > $OUT/bench.log 2>&1
grep -v -i warn $OUT/bench.log | grep -E "^triton|^sdpa-cudnn" | awk '{print $1,$2,$3,$4,$5,$6,$8,$9,$10,$12}'
echo "== specialization sweep"; step 90 python3 devtools/gluon_specialize.py > $OUT/spec.log 2>&1
grep -v -i warn $OUT/spec.log | grep -E "cudnn|launched|all spec|none spec"
