# Session 9, check 1 (what session 8 owed, on the final kernel at 2ceab42+): the fuzz run to its end,
# the memory test, then the GPU tests of the Gluon forward after the host-side descriptor review (2ceab42 had
# no GPU run) with whatever time the call has left. ~9.5 min.
. devtools/device_setup.sh
t0=$(date +%s)
step() { local s=$(date +%s); timeout -s TERM "$@"; echo "  exit $? after $(( $(date +%s) - s )) s"; }
echo "== fuzz triton 10000"; step 380 python3 -m faverify fuzz --kernel triton --iters 10000 --dtype bf16,fp16 \
  --mode both --no-db --json $OUT/fuzz_triton.json > $OUT/fuzz.log 2>&1; grep -A4 "== Summary" $OUT/fuzz.log
grep -E "warm-up|code path|gluon|Failures|minimal case|reason|cases/s" $OUT/fuzz.log | head -12
echo "== memory"; step 60 python3 -m pytest -q -p no:cacheprovider property_tests/test_memory.py -s > $OUT/mem.log 2>&1
grep -E "peak|MiB|passed|failed" $OUT/mem.log
left=$(( 565 - ($(date +%s) - t0) ))
echo "== Gluon forward GPU tests (limit $left s)"; step $left python3 -m pytest -q -p no:cacheprovider -rs \
  property_tests/test_triton_kernels.py -k "hopper or code_paths or init_modes or gqa or strided or deterministic or descriptors or no_keys or gluon_mutant" \
  property_tests/test_mutants.py::test_a_gluon_mutant_fails_in_a_worker_process > $OUT/tests.log 2>&1
grep -v -i warn $OUT/tests.log | tail -15
