# Session 7, issue 3, check 2 of 2: the GPU tests of the Triton kernels (the Gluon forward's included), the
# memory test, and faverify mutants with the Gluon forward's mutants. ~7 min.
. devtools/device_setup.sh
step() { local s=$(date +%s); timeout -s TERM "$@"; echo "  exit $? after $(( $(date +%s) - s )) s"; }
echo "== tests"; step 200 python3 -m pytest -q -m "not slow" -p no:cacheprovider property_tests/test_triton_kernels.py \
  property_tests/test_memory.py > $OUT/tests.log 2>&1; tail -6 $OUT/tests.log
echo "== mutants"; step 280 python3 -m faverify mutants --iters 300 --json $OUT/mutants.json > $OUT/mutants.log 2>&1
grep -v -i "warn" $OUT/mutants.log | tail -30
