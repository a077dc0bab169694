# Session 8, check 1: the code paths each case reports, the Gluon mutant through a worker process (why the
# ws mutants survived in session 7), the ws mutants with how many cases ran their code, the memory test.
. devtools/device_setup.sh
step() { local s=$(date +%s); timeout -s TERM "$@"; echo "  exit $? after $(( $(date +%s) - s )) s"; }
echo "== paths and the worker mutant"; step 150 python3 -m pytest -q -p no:cacheprovider -x \
  property_tests/test_triton_kernels.py::test_each_case_reports_the_code_paths_it_took \
  property_tests/test_mutants.py::test_a_gluon_mutant_fails_in_a_worker_process > $OUT/t1.log 2>&1; tail -25 $OUT/t1.log | grep -v -i warn
echo "== probe"; step 80 python3 devtools/mutant_probe.py ws-consumer-rows > $OUT/probe.log 2>&1; grep -v -i warn $OUT/probe.log | tail -6
echo "== ws mutants"; step 180 python3 -m faverify mutants --iters 100 --json $OUT/mutants.json \
  --only ws-no-neg-inf-guard,ws-no-rescale,ws-causal-top-left,ws-tail-tile-unmasked,ws-consumer-rows > $OUT/mutants.log 2>&1
grep -v -i "warn" $OUT/mutants.log | tail -16
echo "== memory"; step 120 python3 -m pytest -q -p no:cacheprovider property_tests/test_memory.py -s > $OUT/mem.log 2>&1; tail -8 $OUT/mem.log
