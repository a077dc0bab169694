# Session 10, check 3, on the committed kernel (ed8993e+): the fuzz run, memory, the GPU tests that
# reach the Gluon forward, all mutants, the full untuned bench twice (the row at the line, 0.88 in session
# 9), and the sweep's TMA-bits check at one tile. In two calls (one call may take 10 min): part 1 ~5 min,
# part 2 ~3.5 min.   bash devtools/gpu_session10c.sh 1|2
. devtools/device_setup.sh
step() { local s=$(date +%s); timeout -s TERM "$@"; echo "  exit $? after $(( $(date +%s) - s )) s"; }
if [ "$1" = 1 ]; then
echo "== fuzz triton 10000"; step 200 python3 -m faverify fuzz --kernel triton --iters 10000 --dtype bf16,fp16 \
  --mode both --no-db --json $OUT/fuzz_triton.json > $OUT/fuzz.log 2>&1; grep -A4 "== Summary" $OUT/fuzz.log
grep -E "warm-up|code path|gluon|Failures|minimal case|cases/s" $OUT/fuzz.log | head -8
for i in 1 2; do
  echo "== bench $i"; step 110 python3 -m faverify bench --kernel triton --headdims 64,128 --seqlens 4096,16384 \
    --dtype bf16,fp16 --no-tune --json $OUT/bench$i.json > $OUT/bench$i.log 2>&1
  grep -v -i warn $OUT/bench$i.log | grep -E "^triton|^sdpa-cudnn" | awk '{print $1,$2,$3,$4,$5,$6,$8,$9,$10,$12}'
done
echo "== memory"; step 60 python3 -m pytest -q -p no:cacheprovider property_tests/test_memory.py -s > $OUT/mem.log 2>&1
grep -E "peak|MiB|passed|failed" $OUT/mem.log
else
echo "== Gluon GPU tests"; step 100 python3 -m pytest -q -p no:cacheprovider -rs \
  property_tests/test_triton_kernels.py -k "hopper or code_paths or init_modes or gqa or strided or deterministic or descriptors or no_keys or one_compile" \
  property_tests/test_mutants.py::test_a_gluon_mutant_fails_in_a_worker_process > $OUT/tests.log 2>&1
grep -v -i warn $OUT/tests.log | grep -E "passed|failed|Error" | tail -5
echo "== mutants 60"; step 130 python3 -m faverify mutants --iters 60 --json $OUT/mutants.json > $OUT/mutants.log 2>&1
grep -v -i warn $OUT/mutants.log | grep -E "^killed|^control|survived" | cut -c1-140
echo "== sweep TMA bits"; step 40 python3 devtools/triton_fwd_sweep.py --headdims 64 --seqlens 4096 --paths tma1 > $OUT/sweep.log 2>&1
grep -v -i warn $OUT/sweep.log | grep -E "bits|tma1"
for i in 1 2 3; do  # part 1's second bench read fp16 d128 non-causal 4096 at 0.89 (cuDNN 613.6 TF/s, 596.1 before)
  echo "== bench d128 non-causal $i"; step 60 python3 -m faverify bench --kernel triton --headdims 128 \
    --seqlens 4096,16384 --causal false --dtype bf16,fp16 --mode fwd --no-tune > $OUT/bench128_$i.log 2>&1
  grep -v -i warn $OUT/bench128_$i.log | grep -E "^triton|^sdpa-cudnn" | awk '{print $1,$2,$3,$4,$5,$6,$7}'
done
fi
