# Session 7: why the Gluon forward's mutants survived `faverify mutants` (check 2): the probe in one
# process, then one mutant without worker processes. ~3 min.
. devtools/device_setup.sh
step() { local s=$(date +%s); timeout -s TERM "$@"; echo "  exit $? after $(( $(date +%s) - s )) s"; }
echo "== probe"; step 60 python3 devtools/mutant_probe.py ws-consumer-rows 2>&1 | grep -v -i warn | tail -4
echo "== mutant in process"; step 100 python3 -m faverify mutants --iters 40 --no-isolate --jobs 1 \
  --only ws-tail-tile-unmasked --shrink-budget 3 > $OUT/m.log 2>&1; grep -v -i "warn\|cases/s" $OUT/m.log | tail -6
