# Session 3, one H200: the GPU tests (the CUDA refactors and the once-per-arch parameter check were not
# GPU-run), then the two runs the warm-up and the parallel mutants were built for: the Triton fuzz of
# 10000 cases (issue 3) and mutants --iters 1000 (issue 6). Time-boxed steps writing under $OUT; ~9.5 min.
. devtools/device_setup.sh
step() { local s=$(date +%s); timeout -s TERM "$@"; echo "  exit $? after $(( $(date +%s) - s )) s"; }
export FAVERIFY_CACHE=/tmp/fvcache
nproc; free -g | head -2
echo "== pytest -m gpu"; step 110 python3 -m pytest -q -p no:cacheprovider -m gpu property_tests > $OUT/pytest.log 2>&1
grep -E "passed|failed|FAILED|Error" $OUT/pytest.log | tail -8
echo "== fuzz triton 10000"; step 270 python3 -m faverify fuzz --kernel triton --iters 10000 --dtype bf16,fp16 --mode both \
  --no-db --json $OUT/triton.json --markdown $OUT/triton.md > $OUT/triton.log 2>&1
grep -E "^triton |warm-up|interrupted|ms per case" $OUT/triton.log | head -5
echo "== mutants 1000"; step 180 python3 -m faverify mutants --iters 1000 --json $OUT/mutants.json > $OUT/mutants.log 2>&1
tail -22 $OUT/mutants.log
