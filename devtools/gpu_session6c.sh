# Session 6, issue 3, last call: bench --tune on the d128 causal rows (the backward's weakest, 0.95x sdpa-flash
# with the default tiles), and the seeded-bug mutants on the GPU, whose forward now loads through TMA.
# One H200, ~5 min.
. devtools/device_setup.sh
step() { local s=$(date +%s); timeout -s TERM "$@"; echo "  exit $? after $(( $(date +%s) - s )) s"; }
echo "== bench --tune, d128 causal"; step 130 python3 -m faverify bench --kernel triton --headdims 128 --seqlens 4096,16384 \
  --dtype bf16 --causal true --json $OUT/bench_tuned.json > $OUT/bench_tuned.log 2>&1; grep -E "triton|kernel" $OUT/bench_tuned.log | grep -v -i warn
echo "== mutants"; step 200 python3 -m faverify mutants --iters 300 --json $OUT/mutants.json > $OUT/mutants.log 2>&1; grep -v "cases/s" $OUT/mutants.log | tail -25
