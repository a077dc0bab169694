# Session 5, first call, on nvidia-h200-x2, two streams side by side, each step time-boxed:
#   GPU 0: Nsight Compute on the `cuda` forward, dq and dkdv kernels, and on sdpa-flash's forward and backward
#          (the yardstick) at d128, seqlen 16384, bf16, non-causal: where the backward's time goes.
#   GPU 1: devtools/gpu_next.sh (what session 4 left owed).
. devtools/device_setup.sh
step() { local s=$(date +%s); timeout -s TERM "$@"; echo "  exit $? after $(( $(date +%s) - s )) s"; }
export FAVERIFY_CACHE=/tmp/fvcache
python3 -c "import torch; from faverify.kernels.cuda import build; build.load(torch.cuda.get_device_capability())"
NCU="ncu --clock-control none --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats
  --section SchedulerStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section InstructionStats"
(
  export CUDA_VISIBLE_DEVICES=0
  echo "== ncu cuda"; step 200 taskset -c 0-15 $NCU -k regex:'fwd|dq_kernel|dkdv' python3 devtools/ncu_cuda.py 16384 128 0 > $OUT/ncu_cuda.txt 2>&1
  echo "== ncu cuda dkdv sources"; step 100 taskset -c 0-15 ncu --clock-control none --section WarpStateStats --section SourceCounters -k regex:dkdv python3 devtools/ncu_cuda.py 16384 128 0 > $OUT/ncu_dkdv_src.txt 2>&1
  echo "== ncu flash"; step 150 taskset -c 0-15 $NCU -k regex:'flash_fwd_kernel|flash_bwd_dq_dk_dv' python3 - > $OUT/ncu_flash.txt 2>&1 <<'PY'
import torch, torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
q, k, v, do = (torch.randn(1, 16, 16384, 128, device="cuda", dtype=torch.bfloat16) for _ in range(4))
for t in (q, k, v): t.requires_grad_()
with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
    out = F.scaled_dot_product_attention(q, k, v)
    torch.autograd.grad(out, (q, k, v), do)
torch.cuda.synchronize()
PY
) > $OUT/stream0.log 2>&1 &
(
  export CUDA_VISIBLE_DEVICES=1
  FAVERIFY_CACHE=/tmp/fvcache_cold bash devtools/gpu_next.sh > /dev/null 2>&1
  cat $OUT/log.txt
) > $OUT/stream1.log 2>&1 &
wait; cat $OUT/stream0.log; grep -c . $OUT/ncu_*.txt; tail -70 $OUT/stream1.log
