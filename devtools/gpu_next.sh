# The GPU work still owed (see docs/measurements.md and the issues' closing notes), in priority order,
# each step time-boxed and writing its results under $OUT even when stopped. One H200; about 9 minutes.
. devtools/device_setup.sh
step() { local s=$(date +%s); timeout -s TERM "$@"; echo "  exit $? after $(( $(date +%s) - s )) s"; }
# 1. the kernels as they are now (backward from row max and log2 l): GPU tests, memory at seqlen 65536
echo "== pytest"; step 200 python3 -m pytest -q -x -p no:cacheprovider property_tests/test_triton_kernels.py property_tests/test_golden_doctor.py -m "not slow" > $OUT/pytest.log 2>&1; tail -3 $OUT/pytest.log
# 2. the unexplained sdpa-flash dq tolerance failures: shrink them (parallel mode shrinks after the draw)
echo "== sdpa-flash"; step 150 python3 -m faverify fuzz --kernel sdpa-flash --iters 3000 --no-db --json $OUT/flash.json > $OUT/flash.log 2>&1; grep -A3 "^sdpa-flash: dq:tolerance" $OUT/flash.log | head -4
# 3. the Triton kernels' fuzz, compile-bound: as many cases as fit
echo "== triton"; step 150 python3 -m faverify fuzz --kernel triton --iters 10000 --dtype bf16,fp16 --no-db --json $OUT/triton.json > $OUT/triton.log 2>&1; grep -E "cases/s" $OUT/triton.log | tail -1
echo "== doctor"; step 60 python3 -m faverify doctor --json $OUT/doctor.json > $OUT/doctor.log 2>&1; tail -12 $OUT/doctor.log
