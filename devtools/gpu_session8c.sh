# Session 8, check 3: consumers skip the causal key tiles fully masked for their rows. The Gluon FP64 test,
# then the sweep: one program per block (ws, default), persistent (wsp), head groups of 4 and 32. ~4 min.
. devtools/device_setup.sh
step() { local s=$(date +%s); timeout -s TERM "$@"; echo "  exit $? after $(( $(date +%s) - s )) s"; }
echo "== GPU tests of the Gluon forward"; step 200 python3 -m pytest -q -p no:cacheprovider -x \
  property_tests/test_triton_kernels.py -k "hopper or code_paths or init_modes" > $OUT/t.log 2>&1
grep -v -i "warn" $OUT/t.log | grep -E "passed|failed|Error|error|assert|FAIL" | head -30
for dt in bf16 fp16; do
echo "== sweep $dt"; step 200 python3 devtools/triton_fwd_sweep.py --dtype $dt --seqlens 4096 --paths ws,wsp,ws-g4,ws-g32 --ws-tiles default \
  --json $OUT/sweep_$dt.json > $OUT/sweep_$dt.log 2>&1
grep -E "^d|ws" $OUT/sweep_$dt.log | grep -v best | sed 's/ (max|out - triton out| [0-9.e+-]*)//' | head -40
done
