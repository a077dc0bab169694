# Session 5, for issue 3's next step: Nsight Compute on the Triton forward and on sdpa-cudnn's (the 0.9x
# yardstick), d128, seqlen 16384, bf16, non-causal, one launch each. One H200, ~2 min.
. devtools/device_setup.sh
step() { local s=$(date +%s); timeout -s TERM "$@"; echo "  exit $? after $(( $(date +%s) - s )) s"; }
NCU="ncu --clock-control none --launch-count 1 --section SpeedOfLight --section Occupancy --section LaunchStats
  --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis --section InstructionStats"
echo "== triton"; step 100 $NCU -k regex:'_fwd' python3 devtools/ncu_cuda.py 16384 128 0 triton > $OUT/ncu_triton.txt 2>&1
echo "== cudnn"; step 60 $NCU -k regex:'fprop|fwd|sdpa' python3 devtools/ncu_cuda.py 16384 128 0 cudnn > $OUT/ncu_cudnn.txt 2>&1
grep -E "^  [a-zA-Z_]|Duration|Executed Instructions  |Registers Per|Achieved Active Warps|Issue Slots Busy|highest-utilized|non-fused" $OUT/ncu_*.txt | cut -c1-220
