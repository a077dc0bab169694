# Session 7, issue 3: the Gluon forward's block order: causal blocks reversed (longest first), and the grid
# with heads first, bf16 next to SDPA; its GPU test. ~5 min.
. devtools/device_setup.sh
step() { local s=$(date +%s); timeout -s TERM "$@"; echo "  exit $? after $(( $(date +%s) - s )) s"; }
echo "== sweep"; step 220 python3 devtools/triton_fwd_sweep.py --dtype bf16 --paths ws \
  --json $OUT/sweep.json > $OUT/sweep.log 2>&1; grep -E "^d|ws" $OUT/sweep.log | cut -c1-140
echo "== hopper tests"; step 200 python3 -m pytest -q -x -p no:cacheprovider property_tests/test_triton_kernels.py \
  -k "hopper" > $OUT/test.log 2>&1; tail -4 $OUT/test.log
