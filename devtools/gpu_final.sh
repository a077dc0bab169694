# One time-boxed pass over what the issues ask of the GPU; every step writes its results under $OUT even
# when `timeout` stops it (SIGTERM is handled like Ctrl-C).
. devtools/device_setup.sh
step() { local s=$(date +%s); timeout -s TERM "$@"; echo "  exit $? after $(( $(date +%s) - s )) s"; }
echo "== pytest (GPU)"; step 75 python3 -m pytest -q -x -p no:cacheprovider property_tests/test_triton_kernels.py -m "not slow" > $OUT/pytest.log 2>&1; tail -2 $OUT/pytest.log
echo "== triton fuzz"; step 140 python3 -m faverify fuzz --kernel triton --iters 10000 --dtype bf16,fp16 --mode both --no-db --json $OUT/triton.json > $OUT/triton.log 2>&1
grep -E "cases/s, failed" $OUT/triton.log | tail -1
echo "== bench"; step 150 python3 -m faverify bench --kernel triton --seqlens 4096,16384 --headdims 64,128 --dtype bf16,fp16 --json $OUT/bench.json > $OUT/bench.log 2>&1; grep -E "^(triton|sdpa-flash|sdpa-cudnn) " $OUT/bench.log
for k in sdpa-flash:60 sdpa-efficient:50 sdpa-cudnn:30; do
  echo "== ${k%%:*}"; step ${k##*:} python3 -m faverify fuzz --kernel ${k%%:*} --iters 10000 --dtype bf16,fp16 --no-db --json $OUT/${k%%:*}.json > $OUT/${k%%:*}.log 2>&1
  grep -E "cases/s, failed" $OUT/${k%%:*}.log | tail -1
done
tar czf $OUT/logs.tgz -C $OUT --exclude logs.tgz . 2>/dev/null
