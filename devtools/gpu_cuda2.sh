# The CUDA kernels after the MT=2 tiles (issue 4): tests, bench, sanitizers, the 10000-case fuzz; ~9 min.
. devtools/device_setup.sh
step() { local s=$(date +%s); timeout -s TERM "$@"; echo "  exit $? after $(( $(date +%s) - s )) s"; }
export FAVERIFY_CACHE=/tmp/fvcache
echo "== cold build"; step 120 python3 -c "
import time, torch
from faverify.kernels.cuda import build
t = time.time(); build.load(torch.cuda.get_device_capability()); print(f'cold build {time.time() - t:.1f} s')"
echo "== pytest"; step 150 python3 -m pytest -q -p no:cacheprovider -rs property_tests/test_cuda_kernels.py \
  property_tests/test_memory.py -k "cuda" -s > $OUT/pytest.log 2>&1
grep -E "passed|failed|FAILED|Error|peak extra" $OUT/pytest.log | tail -20
echo "== bench"; step 100 python3 -m faverify bench --kernel cuda --headdims 64,128 --seqlens 4096,16384 --dtype bf16,fp16 \
  --no-tune --json $OUT/bench.json > $OUT/bench.log 2>&1; grep -E "^(cuda|sdpa-flash) " $OUT/bench.log
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
echo "== memcheck"; step 90 $SAN --tool memcheck python3 devtools/sanitize_cases.py > $OUT/memcheck.log 2>&1; tail -3 $OUT/memcheck.log
echo "== racecheck"; step 120 $SAN --tool racecheck python3 devtools/sanitize_cases.py > $OUT/racecheck.log 2>&1; tail -3 $OUT/racecheck.log
echo "== fuzz"; step 230 python3 -m faverify fuzz --kernel cuda,cuda-simt --iters 10000 --dtype bf16,fp16 --mode both \
  --no-db --json $OUT/fuzz10k.json > $OUT/fuzz10k.log 2>&1; sed -n '/== Summary/,/^cases per device/p' $OUT/fuzz10k.log; grep -A8 "== Failures" $OUT/fuzz10k.log | head -12
