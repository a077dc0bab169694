# Session 5: the tile knobs again after the loader change (devtools/cuda_tune.py, d128 bf16, each variant
# next to sdpa-flash in its own process). One H200, ~4 min.
. devtools/device_setup.sh
step() { local s=$(date +%s); timeout -s TERM "$@"; echo "  exit $? after $(( $(date +%s) - s )) s"; }
export FAVERIFY_CACHE=/tmp/fvcache
for defs in "" "-DFA_FWD_BN128=32" "-DFA_DKDV_WARPS=8" "-DFA_DQ_BN128=48"; do
  echo "== ${defs:-default}"
  FAVERIFY_CUDA_DEFINES="$defs" step 100 python3 devtools/cuda_tune.py --label "${defs:-default}" --seqlens 4096,16384 2>&1 | grep '^{'
done 2>&1 | tee $OUT/log.txt
