# The last GPU check session 5 owed (docs/measurements.md, "Session 5"), run at its end: the SDPA skip
# reasons without shapes or source locations (4d186e1), one row per reason for sdpa-efficient (before, one
# per shape). Nothing else is owed. One H200; about 2 minutes.
. devtools/device_setup.sh
step() { local s=$(date +%s); timeout -s TERM "$@"; echo "  exit $? after $(( $(date +%s) - s )) s"; }
export FAVERIFY_CACHE=${FAVERIFY_CACHE:-/tmp/fvcache}
{
echo "== sdpa-efficient"; step 90 python3 -m faverify fuzz --kernel sdpa-efficient --iters 3000 --dtype bf16,fp16 --no-db \
  --json /tmp/efficient.json 2>&1 | sed -n '/== Skipped cases/,/== Failures/p' | head -20
} 2>&1 | tee $OUT/log.txt
