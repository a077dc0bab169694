# First GPU check of the CUDA kernels (issue 4), time-boxed steps writing under $OUT; about 9 minutes.
. devtools/device_setup.sh
step() { local s=$(date +%s); timeout -s TERM "$@"; echo "  exit $? after $(( $(date +%s) - s )) s"; }
export FAVERIFY_CACHE=/tmp/fvcache
echo "== cold build"; step 120 python3 -c "
import time, torch
from faverify.kernels.cuda import build
t = time.time(); build.load(torch.cuda.get_device_capability()); print(f'cold build {time.time() - t:.1f} s')"
echo "== warm start"; step 60 python3 -c "
import time, torch
from faverify.kernels.cuda import build
t = time.time(); build.load(torch.cuda.get_device_capability()); print(f'warm load {time.time() - t:.2f} s')"
echo "== pytest"; step 260 python3 -m pytest -q -p no:cacheprovider -rs property_tests/test_cuda_kernels.py \
  property_tests/test_memory.py property_tests/test_triton_kernels.py -m "not slow" -s > $OUT/pytest.log 2>&1
grep -E "passed|failed|FAILED|Error|peak extra" $OUT/pytest.log | tail -30
echo "== fuzz cuda"; step 100 python3 -m faverify fuzz --kernel cuda,cuda-simt --iters 3000 --dtype bf16,fp16 --no-db \
  --json $OUT/cuda.json > $OUT/cuda_fuzz.log 2>&1; tail -30 $OUT/cuda_fuzz.log
echo "== bench"; step 120 python3 -m faverify bench --kernel cuda --headdims 128 --seqlens 4096,16384 --dtype bf16 \
  --no-tune --json $OUT/bench.json > $OUT/bench.log 2>&1; tail -20 $OUT/bench.log
