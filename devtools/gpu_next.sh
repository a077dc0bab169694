# The GPU work still owed after session 4 (docs/measurements.md, "Session 4", says why), in priority
# order, each step time-boxed and writing under $OUT even when stopped. One H200; about 6 minutes.
# Not yet run on the GPU: the SDPA skips with torch's reasons (469319d); the mutants with the verdict
# floor's largest-element scales (a86aa0b: the floor only grew; all 15 mutants were still killed on the CPU).
. devtools/device_setup.sh
step() { local s=$(date +%s); timeout -s TERM "$@"; echo "  exit $? after $(( $(date +%s) - s )) s"; }
export FAVERIFY_CACHE=${FAVERIFY_CACHE:-/tmp/fvcache}
{
# issue 2: the skip table names torch's reasons (sdpa-efficient skips most cases)
echo "== sdpa-efficient"; step 90 python3 -m faverify fuzz --kernel sdpa-efficient --iters 3000 --dtype bf16,fp16 --no-db \
  --json /tmp/efficient.json 2>&1 | sed -n '/== Skipped cases/,/== Failures/p' | head -20
# the verdict floor change against the 15 mutants, on the GPU
echo "== mutants"; step 240 python3 -m faverify mutants --iters 1000 2>&1 | tail -25
# issue 5 (resolved) still owes a cold doctor on one H200
echo "== doctor"; step 150 python3 -m faverify doctor --level full --json $OUT/doctor.json 2>&1 | tail -20
} 2>&1 | tee $OUT/log.txt
