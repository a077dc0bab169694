# Session 6, issue 3: the dkdv tile at d128 causal (M64 N128 w8 s2, bench --tune's choice), checked: the
# fuzz (3000 cases, so it fits the device time left) and the untuned bench of those rows. One H200, ~3 min.
. devtools/device_setup.sh
step() { local s=$(date +%s); timeout -s TERM "$@"; echo "  exit $? after $(( $(date +%s) - s )) s"; }
echo "== fuzz triton"; step 115 python3 -m faverify fuzz --kernel triton --iters 3000 --dtype bf16,fp16 --mode both \
  --no-db --json $OUT/fuzz_triton.json > $OUT/fuzz.log 2>&1; grep -v "cases/s, failed" $OUT/fuzz.log | tail -6; grep -E "warm-up|/3000 cases" $OUT/fuzz.log | tail -2
echo "== bench d128 causal, defaults"; step 50 python3 -m faverify bench --kernel triton --headdims 128 --seqlens 4096,16384 \
  --dtype bf16 --causal true --no-tune --json $OUT/bench.json > $OUT/bench.log 2>&1; grep -E "triton|kernel" $OUT/bench.log | grep -v -i warn
