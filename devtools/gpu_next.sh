# The GPU work still owed (docs/measurements.md, "Session 3", says why), in priority order, each step
# time-boxed and writing under $OUT even when stopped. One H200; about 9.5 minutes.
# Since the last GPU run: shrinks in parallel (fuzz.shrink_all) and signals held while results are written
# (faverify/signals.py): neither has run on the GPU.
. devtools/device_setup.sh
step() { local s=$(date +%s); timeout -s TERM "$@"; echo "  exit $? after $(( $(date +%s) - s )) s"; }
export FAVERIFY_CACHE=/tmp/fvcache
# issue 2: 10000 cases per SDPA backend, wall time against the 60 s target; a time box that stops a run
# must still leave its JSON (the held signals)
for k in sdpa-flash sdpa-efficient; do
  echo "== $k"; step 120 python3 -m faverify fuzz --kernel $k --iters 10000 --dtype bf16,fp16 --no-db \
    --json $OUT/$k.json > $OUT/$k.log 2>&1; grep -E "^$k |interrupted=" $OUT/$k.log | head -2; ls $OUT/$k.json
done
# issue 5: doctor on a single H200 with a cold CUDA build and a cold Triton cache
echo "== doctor full"; step 200 python3 -m faverify doctor --level full --json $OUT/doctor.json > $OUT/doctor.log 2>&1
grep -cE "Pass|Warn" $OUT/doctor.log
# issue 4: the CUDA kernels' speed, the baseline for the next tuning step
echo "== bench cuda"; step 90 python3 -m faverify bench --kernel cuda --headdims 128 --seqlens 4096,16384 --dtype bf16 \
  --no-tune --json $OUT/bench.json > $OUT/bench.log 2>&1; grep -E "^(cuda|sdpa-flash) " $OUT/bench.log
