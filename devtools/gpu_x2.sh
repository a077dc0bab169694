# On the two-GPU kind: the CUDA backward after the dkdv revert (bench, fuzz), fuzz --device all against one
# GPU (issue 7), doctor --level full on both GPUs (issue 5). Time-boxed steps writing under $OUT; ~9 min.
. devtools/device_setup.sh
step() { local s=$(date +%s); timeout -s TERM "$@"; echo "  exit $? after $(( $(date +%s) - s )) s"; }
export FAVERIFY_CACHE=/tmp/fvcache
echo "== cold build"; step 120 python3 -c "
import time, torch
from faverify.kernels.cuda import build
t = time.time(); build.load(torch.cuda.get_device_capability()); print(f'cold build {time.time() - t:.1f} s')"
echo "== bench"; step 60 python3 -m faverify bench --kernel cuda --headdims 128 --seqlens 4096,16384 --dtype bf16 \
  --no-tune --json $OUT/bench.json > $OUT/bench.log 2>&1; grep -E "^(cuda|sdpa-flash) " $OUT/bench.log
echo "== fuzz cuda, all GPUs"; step 100 python3 -m faverify fuzz --kernel cuda --iters 10000 --dtype bf16,fp16 --device all \
  --no-db --json $OUT/all.json > $OUT/all.log 2>&1; grep -E "^cuda |cases per device" $OUT/all.log | head -3
echo "== fuzz cuda, one GPU"; step 120 python3 -m faverify fuzz --kernel cuda --iters 10000 --dtype bf16,fp16 --device cuda:0 \
  --no-db > $OUT/one.log 2>&1; grep -E "^cuda |cases per device" $OUT/one.log | head -3
echo "== fuzz triton, all GPUs"; step 90 python3 -m faverify fuzz --kernel triton --iters 10000 --dtype bf16,fp16 --device all \
  --no-db --json $OUT/triton_all.json > $OUT/triton_all.log 2>&1; grep -E "^triton |cases per device|interrupted" $OUT/triton_all.log | head -4
echo "== doctor full"; step 230 python3 -m faverify doctor --level full --json $OUT/doctor.json > $OUT/doctor.log 2>&1; tail -32 $OUT/doctor.log
