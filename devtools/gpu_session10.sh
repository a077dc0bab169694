# Session 10, check 1: the Gluon forward's consumers past seqlen_q skip their tiles, and each consumer masks
# only from its own first row's diagonal. Old (5bf8dbb's file: git show 5bf8dbb:kernels/triton/forward_hopper.py
# > devtools/ab_old_forward_hopper.py, untracked) against new in one process: same bits, speed; the Gluon GPU
# tests; the 7 ws mutants; the row at the line in two separate bench runs. ~6 min.
. devtools/device_setup.sh
step() { local s=$(date +%s); timeout -s TERM "$@"; echo "  exit $? after $(( $(date +%s) - s )) s"; }
echo "== A/B bf16"; step 150 python3 devtools/gluon_ab.py devtools/ab_old_forward_hopper.py --dtype bf16 > $OUT/ab_bf16.log 2>&1
grep -v -i warn $OUT/ab_bf16.log | grep -E "bits|cudnn|run"
echo "== A/B fp16"; step 100 python3 devtools/gluon_ab.py devtools/ab_old_forward_hopper.py --dtype fp16 --repeats 2 > $OUT/ab_fp16.log 2>&1
grep -v -i warn $OUT/ab_fp16.log | grep -E "bits: |cudnn|run"
echo "== tests"; step 120 python3 -m pytest -q -p no:cacheprovider -rs property_tests/test_triton_kernels.py \
  -k "one_compile or hopper_forward_is_right or code_paths or gluon_mutant" \
  property_tests/test_mutants.py::test_a_gluon_mutant_fails_in_a_worker_process > $OUT/tests.log 2>&1
grep -E "passed|failed|Error|assert" $OUT/tests.log | head -8
echo "== ws mutants"; step 150 python3 -m faverify mutants --iters 40 --json $OUT/mutants.json \
  --only ws-no-neg-inf-guard,ws-no-rescale,ws-causal-top-left,ws-tail-tile-unmasked,ws-skip-own-diagonal,ws-partial-consumer-idle,ws-consumer-rows > $OUT/mutants.log 2>&1
grep -v -i warn $OUT/mutants.log | grep -E "^ws-|^killed|^control|survived" | cut -c1-140
for i in 1 2; do
  echo "== bench $i"; step 60 python3 -m faverify bench --kernel triton --headdims 64 --seqlens 4096 --causal true \
    --dtype bf16,fp16 --mode fwd --no-tune > $OUT/bench$i.log 2>&1
  grep -v -i warn $OUT/bench$i.log | grep -E "^triton|^sdpa-cudnn" | awk '{print $1,$2,$3,$4,$5,$6,$8,$9}'
done
