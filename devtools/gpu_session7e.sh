# Session 7, issue 3, check 1 of 2 of the Gluon forward as the default on the H200: the fuzz run
# (10000 cases, bf16 and fp16, forward and backward) and the untuned bench of the 16 configurations. ~7 min.
. devtools/device_setup.sh
step() { local s=$(date +%s); timeout -s TERM "$@"; echo "  exit $? after $(( $(date +%s) - s )) s"; }
echo "== fuzz triton 10000"; step 250 python3 -m faverify fuzz --kernel triton --iters 10000 --dtype bf16,fp16 \
  --mode both --no-db --json $OUT/fuzz_triton.json > $OUT/fuzz.log 2>&1; grep -v "cases/s, failed" $OUT/fuzz.log | tail -8
grep -E "warm-up" $OUT/fuzz.log | tail -1
echo "== bench"; step 230 python3 -m faverify bench --kernel triton --headdims 64,128 --seqlens 4096,16384 \
  --dtype bf16,fp16 --no-tune --json $OUT/bench.json > $OUT/bench.log 2>&1; grep -v -i warn $OUT/bench.log | tail -45
