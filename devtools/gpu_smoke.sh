# First look on the GPU: GPU tests, short fuzz runs of every subject, an untuned bench.
. devtools/device_setup.sh
s=$(date +%s)
timeout 200 python3 -m pytest -q -x -p no:cacheprovider property_tests/test_triton_kernels.py -m "not slow" 2>&1 | tail -4
echo "pytest: $(( $(date +%s) - s )) s"
for k in sdpa-flash sdpa-cudnn sdpa-efficient; do
  s=$(date +%s)
  timeout 100 python3 -m faverify fuzz --kernel $k --iters ${SDPA_ITERS:-300} --no-db --json $OUT/$k.json > $OUT/$k.log 2>&1
  echo "$k exit $?: $(( $(date +%s) - s )) s"; grep -E "ms per case|cases/s, failed" $OUT/$k.log | tail -2
done
s=$(date +%s)
timeout 200 python3 -m faverify fuzz --kernel triton --iters ${TRITON_ITERS:-500} --no-db --json $OUT/triton.json > $OUT/triton.log 2>&1
echo "triton exit $?: $(( $(date +%s) - s )) s"; grep -E "ms per case|cases/s, failed" $OUT/triton.log | tail -2
s=$(date +%s)
timeout 150 python3 -m faverify bench --kernel triton --seqlens 4096 --headdims 64,128 --dtype bf16 --no-tune \
  --json $OUT/bench.json 2>$OUT/bench.err; echo "bench exit $?: $(( $(date +%s) - s )) s"; tail -3 $OUT/bench.err
for f in $OUT/*.log; do grep -A14 "== Failures ([1-9]" $f | head -16; done
