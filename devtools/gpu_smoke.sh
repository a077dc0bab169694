# First look on the GPU: GPU tests, short fuzz runs of every subject, an untuned bench.
. devtools/device_setup.sh
s=$(date +%s)
timeout 200 python3 -m pytest -q -x -p no:cacheprovider property_tests/test_triton_kernels.py -m "not slow" 2>&1 | tail -15
echo "pytest: $(( $(date +%s) - s )) s"; s=$(date +%s)
timeout 150 python3 -m faverify fuzz --kernel sdpa-flash,sdpa-efficient,sdpa-cudnn --iters 1000 --no-db \
  --json $OUT/sdpa.json --markdown $OUT/sdpa.md > $OUT/sdpa.log 2>&1; echo "sdpa exit $?: $(( $(date +%s) - s )) s"
grep -A6 "== Summary" $OUT/sdpa.log | tail -4; s=$(date +%s)
timeout 200 python3 -m faverify fuzz --kernel triton --iters 1000 --no-db --json $OUT/triton.json > $OUT/triton.log 2>&1
echo "triton exit $?: $(( $(date +%s) - s )) s"; grep -A4 "== Summary" $OUT/triton.log | tail -2; s=$(date +%s)
timeout 150 python3 -m faverify bench --kernel triton --seqlens 4096 --headdims 64,128 --dtype bf16 --no-tune \
  --json $OUT/bench.json 2>$OUT/bench.err; echo "bench exit $?: $(( $(date +%s) - s )) s"; tail -3 $OUT/bench.err
grep -B2 -A12 "== Failures" $OUT/sdpa.log | head -60
grep -A30 "== Failures" $OUT/triton.log | head -40
