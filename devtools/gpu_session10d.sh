# Session 10, check 4: part 2 of gpu_session10c.sh ran out of its limits; test 8 of the Gluon GPU tests
# failed (its output lost): the TMA-bits test, which on sm_90 compared the Gluon forward with the pointer
# path. Its falsifying case under the old test (git show 5bf8dbb:property_tests/test_triton_kernels.py >
# property_tests/_orig_tma_test.py, untracked), the fixed test, the rest of the Gluon GPU tests, and the Gluon
# forward's bits against 5bf8dbb's on small shapes (devtools/ab_old_forward_hopper.py, as gpu_session10.sh).
# ~4 min.
. devtools/device_setup.sh
step() { local s=$(date +%s); timeout -s TERM "$@"; echo "  exit $? after $(( $(date +%s) - s )) s"; }
echo "== old TMA test"; step 60 python3 -m pytest -x -q -p no:cacheprovider property_tests/_orig_tma_test.py \
  -k descriptors_gives > $OUT/orig.log 2>&1
grep -E "Falsifying|^Case|case=|head_dim|passed|failed|AssertionError" $OUT/orig.log | head -12
echo "== bits vs 5bf8dbb"; step 60 python3 devtools/gluon_ab.py devtools/ab_old_forward_hopper.py --bits-only > $OUT/ab.log 2>&1
grep -E "bits" $OUT/ab.log | tail -4
echo "== Gluon GPU tests"; step 150 python3 -m pytest -q -p no:cacheprovider -rs property_tests/test_triton_kernels.py \
  -k "descriptors_gives or hopper or gqa or strided" \
  property_tests/test_mutants.py::test_a_gluon_mutant_fails_in_a_worker_process > $OUT/tests.log 2>&1
grep -v -i warn $OUT/tests.log | grep -E "passed|failed|Error|^FAILED" | tail -6
