# Session 8, check 4 (final kernel): the untuned bench of the 16 configurations, the fuzz run
# (10000 cases, bf16 and fp16, forward and backward), the Gluon forward's 6 mutants (their cases narrowed
# to the ones that reach it). ~9.5 min.
. devtools/device_setup.sh
step() { local s=$(date +%s); timeout -s TERM "$@"; echo "  exit $? after $(( $(date +%s) - s )) s"; }
echo "== bench"; step 140 python3 -m faverify bench --kernel triton --headdims 64,128 --seqlens 4096,16384 \
  --dtype bf16,fp16 --no-tune --json $OUT/bench.json > $OUT/bench.log 2>&1; grep -v -i warn $OUT/bench.log | grep -E "triton|cudnn|flash|exit|pass|FAIL" | tail -50
echo "== fuzz triton 10000"; step 265 python3 -m faverify fuzz --kernel triton --iters 10000 --dtype bf16,fp16 \
  --mode both --no-db --json $OUT/fuzz_triton.json > $OUT/fuzz.log 2>&1; grep -A4 "== Summary" $OUT/fuzz.log
grep -E "warm-up|code path|Failures|minimal case|reason" $OUT/fuzz.log | head -8
echo "== mutants of the Gluon forward"; step 140 python3 -m faverify mutants --iters 40 --json $OUT/mutants.json \
  --only ws-no-neg-inf-guard,ws-no-rescale,ws-causal-top-left,ws-tail-tile-unmasked,ws-skip-own-diagonal,ws-consumer-rows > $OUT/mutants.log 2>&1
grep -v -i "warn" $OUT/mutants.log | grep -v "cases/s" | tail -14
