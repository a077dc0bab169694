# Session 7, issue 3: the Gluon forward's tiles (and in the first run its schedules: FA3's intra-warpgroup overlap, ping-pong between the
# consumers) and tiles, next to the Triton forward's default and SDPA, bf16; its GPU test. ~8 min.
. devtools/device_setup.sh
step() { local s=$(date +%s); timeout -s TERM "$@"; echo "  exit $? after $(( $(date +%s) - s )) s"; }
echo "== sweep"; step 300 python3 devtools/triton_fwd_sweep.py --dtype bf16 --paths ws,tma1 --json $OUT/sweep.json \
  > $OUT/sweep.log 2>&1; grep -E "^d|best|tma1" $OUT/sweep.log | cut -c1-150; grep "ws " $OUT/sweep.log | sort -t: -k2 -rn | head -0
python3 - <<'PY'
import json, os
rows = json.load(open(os.environ["OUT"] + "/sweep.json"))
for r in rows:
    ws = sorted(((v, k) for k, v in r["tiles"].items() if k.startswith("ws")), reverse=True)[:4]
    print(f"d{r['d']} c{int(r['causal'])} n{r['seqlen']} cudnn {r['cudnn_tflops']:.0f}: " +
          " | ".join(f"{k.split(' (')[0][3:]} {v:.0f} {v / r['cudnn_tflops']:.2f}" for v, k in ws))
    print("   diffs:", max(float(k.split('| ')[-1].rstrip(')')) for k in r["tiles"] if k.startswith("ws")))
PY
echo "== hopper tests"; step 200 python3 -m pytest -q -x -p no:cacheprovider property_tests/test_triton_kernels.py \
  -k "hopper" > $OUT/test.log 2>&1; tail -4 $OUT/test.log
