# Session 7, issue 3: the warp-specialized Gluon forward (forward_hopper.py) on the H200: its GPU test
# against FP64, then its tiles next to the Triton forward's default and SDPA, bf16. One H200, ~8 min.
. devtools/device_setup.sh
step() { local s=$(date +%s); timeout -s TERM "$@"; echo "  exit $? after $(( $(date +%s) - s )) s"; }
echo "== hopper tests"; step 240 python3 -m pytest -q -x -p no:cacheprovider property_tests/test_triton_kernels.py \
  -k "hopper" > $OUT/test.log 2>&1; tail -25 $OUT/test.log
echo "== sweep"; step 280 python3 devtools/triton_fwd_sweep.py --dtype bf16 --paths ws,tma1 --json $OUT/sweep.json \
  > $OUT/sweep.log 2>&1; cat $OUT/sweep.log | cut -c1-150
