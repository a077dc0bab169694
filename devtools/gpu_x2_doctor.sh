# Session 3, nvidia-h200-x2: the GPU tests, doctor --level full on both GPUs (issue 5; golden checks now
# all at once), then the Triton fuzz of 10000 cases on one GPU with the warm-up on every core and the
# fp32 variants of the gradient check warmed too (issue 3). Time-boxed steps writing under $OUT; ~9.5 min.
. devtools/device_setup.sh
step() { local s=$(date +%s); timeout -s TERM "$@"; echo "  exit $? after $(( $(date +%s) - s )) s"; }
export FAVERIFY_CACHE=/tmp/fvcache
echo "== pytest -m gpu"; step 140 python3 -m pytest -q -p no:cacheprovider -m gpu property_tests > $OUT/pytest.log 2>&1
grep -E "passed|failed|FAILED|Error" $OUT/pytest.log | tail -8
echo "== doctor full"; step 170 python3 -m faverify doctor --level full --json $OUT/doctor.json > $OUT/doctor.log 2>&1
grep -vE "^doctor: " $OUT/doctor.log | tail -40
echo "== fuzz triton 10000"; step 250 python3 -m faverify fuzz --kernel triton --iters 10000 --dtype bf16,fp16 --mode both \
  --no-db --json $OUT/triton.json --markdown $OUT/triton.md > $OUT/triton.log 2>&1
grep -E "^triton |warm-up|interrupted|ms per case" $OUT/triton.log | head -5
