# Session 6, issue 3, the committed state: the Triton forward through tensor descriptors with the tiles
# session 6's sweep chose. One H200, ~9 min: bench (ratios against SDPA in the same run), the fuzz the
# issue names, the memory test and the Triton kernel tests on the GPU.
. devtools/device_setup.sh
step() { local s=$(date +%s); timeout -s TERM "$@"; echo "  exit $? after $(( $(date +%s) - s )) s"; }
echo "== bench"; step 170 python3 -m faverify bench --kernel triton --headdims 64,128 --seqlens 4096,16384 \
  --dtype bf16,fp16 --no-tune --json $OUT/bench_triton.json > $OUT/bench.log 2>&1; grep -E "triton|kernel" $OUT/bench.log | grep -v -i warn | head -40
echo "== fuzz triton"; step 250 python3 -m faverify fuzz --kernel triton --iters 10000 --dtype bf16,fp16 --mode both \
  --no-db --json $OUT/fuzz_triton.json > $OUT/fuzz.log 2>&1; grep -v "cases/s, failed" $OUT/fuzz.log | tail -12
echo "== tests"; step 130 python3 -m pytest -q -p no:cacheprovider property_tests/test_memory.py property_tests/test_triton_kernels.py \
  -k "memory or descriptor or strided or head_dims or deterministic or gqa" 2>&1 | tail -3
