# Session 4's last GPU check, one H200 (~8 min), each step time-boxed: the committed state after the
# Triton exponent change was reverted and the CUDA forward's epilogue moved to store_rows (822ba7d).
# Also sdpa-cudnn with many workers for as long as the box allows (it builds a cuDNN plan per shape).
. devtools/device_setup.sh
step() { local s=$(date +%s); timeout -s TERM "$@"; echo "  exit $? after $(( $(date +%s) - s )) s"; }
export FAVERIFY_CACHE=/tmp/fvcache
{
echo "== build"; step 120 python3 -c "import torch; from faverify.kernels.cuda import build; build.load(torch.cuda.get_device_capability())"
echo "== pytest -m gpu"; step 150 python3 -m pytest -q -p no:cacheprovider -m gpu -rs property_tests 2>&1 | tail -4
echo "== fuzz cuda"; step 120 python3 -m faverify fuzz --kernel cuda --iters 10000 --dtype bf16,fp16 --mode both --no-db \
  --json $OUT/fuzz_cuda.json 2>&1 | grep -A3 "^kernel  " | head -4
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for tool in memcheck racecheck; do echo "== $tool"; step 60 $SAN --tool $tool python3 devtools/sanitize_cases.py mma 2>&1 | tail -2; done
echo "== bench cuda"; step 60 python3 -m faverify bench --kernel cuda --headdims 128 --seqlens 4096,16384 --dtype bf16 \
  --no-tune --json $OUT/bench_cuda.json 2>&1 | grep -E "^(cuda|sdpa-flash) "
echo "== fuzz triton"; step 150 python3 -m faverify fuzz --kernel triton --iters 2000 --dtype bf16,fp16,fp32 --mode both \
  --no-db --json $OUT/fuzz_triton.json 2>&1 | grep -E -A3 "^kernel  |^warm-up" | head -8
echo "== sdpa-cudnn"; step 140 python3 -m faverify fuzz --kernel sdpa-cudnn --iters 10000 --dtype bf16,fp16 --no-db \
  --workers 14 --json $OUT/cudnn.json > $OUT/cudnn.log 2>&1; grep -E -A3 "^kernel  " $OUT/cudnn.log | head -4
grep -E "interrupted=|^sdpa-cudnn: .* \(|minimal case" $OUT/cudnn.log | head -20
} 2>&1 | tee $OUT/log.txt
