# Session 10, check 2: with idle consumers skipping (ed8993e), the Gluon forward's tile candidates at d64
# (M128/M192 x N64/N128 x 2/3 stages), bf16 at 4096 and 16384, fp16 at 4096. ~3 min.
. devtools/device_setup.sh
step() { local s=$(date +%s); timeout -s TERM "$@"; echo "  exit $? after $(( $(date +%s) - s )) s"; }
echo "== sweep bf16"; step 200 python3 devtools/triton_fwd_sweep.py --dtype bf16 --headdims 64 --seqlens 4096,16384 \
  --paths ws --json $OUT/sweep_bf16.json > $OUT/sweep_bf16.log 2>&1
grep -v -i warn $OUT/sweep_bf16.log | grep -E "cudnn"
echo "== sweep fp16"; step 120 python3 devtools/triton_fwd_sweep.py --dtype fp16 --headdims 64 --seqlens 4096 \
  --paths ws --json $OUT/sweep_fp16.json > $OUT/sweep_fp16.log 2>&1
grep -v -i warn $OUT/sweep_fp16.log | grep -E "cudnn"
