# Issue 4 tuning on one H200 (~4 min): CUDA tile variants built side by side (FAVERIFY_CUDA_DEFINES),
# each timed and checked against FP64 by devtools/cuda_tune.py; then issue 2's sdpa-flash at 10000 cases.
# At most 8 files come back from $OUT: one log per step.
. devtools/device_setup.sh
step() { local s=$(date +%s); timeout -s TERM "$@"; echo "  exit $? after $(( $(date +%s) - s )) s"; }
export FAVERIFY_CACHE=/tmp/fvcache
VARIANTS=("-DFA_FWD_BN128=48" "-DFA_FWD_BN128=48 -DFA_FWD_LAZY=1"
          "-DFA_FWD_BN128=48 -DFA_CAUSAL_REVERSE=1 -DFA_DQ_BN128=48"
          "-DFA_FWD_BN128=48 -DFA_FWD_LAZY=1 -DFA_CAUSAL_REVERSE=1 -DFA_DQ_BN128=48")
echo "== builds"; s=$(date +%s)
for defs in "${VARIANTS[@]}"; do
  FAVERIFY_CUDA_DEFINES="$defs" timeout 150 python3 -c "
import torch; from faverify.kernels.cuda import build; build.load(torch.cuda.get_device_capability())" \
    >> "$OUT/builds.log" 2>&1 &
done; wait; echo "  builds done after $(( $(date +%s) - s )) s"; tail -n 5 $OUT/builds.log
echo "== tune"
for defs in "${VARIANTS[@]}"; do
  FAVERIFY_CUDA_DEFINES="$defs" step 60 python3 devtools/cuda_tune.py --label "[$defs]" >> $OUT/tune.jsonl 2>> $OUT/tune.err
done; cat $OUT/tune.jsonl; grep -v Warn $OUT/tune.err | grep -v _warn_once | tail -5
k=sdpa-flash; echo "== $k"; step 150 python3 -m faverify fuzz --kernel $k --iters 10000 --dtype bf16,fp16 --no-db \
  --json $OUT/$k.json > $OUT/$k.log 2>&1; grep -A3 "^kernel  " $OUT/$k.log | head -4; grep "interrupted" $OUT/$k.log | head -2
