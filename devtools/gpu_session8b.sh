# Session 8, check 2: the persistent Gluon forward with host-made descriptors. Its GPU tests (FP64 on 40
# cases, on 3 programs and on one per SM; the tests that reach it), then persistent against one program per
# query block (ws / ws1) at the default tiles, next to cuDNN. ~5 min.
. devtools/device_setup.sh
step() { local s=$(date +%s); timeout -s TERM "$@"; echo "  exit $? after $(( $(date +%s) - s )) s"; }
echo "== GPU tests of the Gluon forward"; step 240 python3 -m pytest -q -p no:cacheprovider -x \
  property_tests/test_triton_kernels.py -k "hopper or code_paths or init_modes or no_keys or deterministic or strided or descriptors or gqa or head_dims_padded" \
  property_tests/test_mutants.py::test_a_gluon_mutant_fails_in_a_worker_process > $OUT/t.log 2>&1
grep -v -i "warn" $OUT/t.log | grep -E "passed|failed|Error|error|assert|FAIL" | head -30
echo "== sweep bf16"; step 200 python3 devtools/triton_fwd_sweep.py --paths ws,ws1 --ws-tiles default --json $OUT/sweep.json > $OUT/sweep.log 2>&1
grep -E "^d|ws" $OUT/sweep.log | grep -v best | head -40
