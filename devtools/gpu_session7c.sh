# Session 7, issue 3: the Gluon forward at head dim 64: three consumer warpgroups (192 query rows per block)
# and two blocks per SM, next to the Triton forward's default and SDPA, bf16; its GPU test. ~4 min.
. devtools/device_setup.sh
step() { local s=$(date +%s); timeout -s TERM "$@"; echo "  exit $? after $(( $(date +%s) - s )) s"; }
echo "== sweep"; step 200 python3 devtools/triton_fwd_sweep.py --dtype bf16 --headdims 64 --paths ws,tma1 \
  --json $OUT/sweep.json > $OUT/sweep.log 2>&1; grep -E "^d|tma1|ws" $OUT/sweep.log | cut -c1-140
echo "== hopper tests"; step 200 python3 -m pytest -q -x -p no:cacheprovider property_tests/test_triton_kernels.py \
  -k "hopper" > $OUT/test.log 2>&1; tail -4 $OUT/test.log
