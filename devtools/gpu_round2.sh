. devtools/device_setup.sh
timeout 150 python3 -m pytest -q -x -p no:cacheprovider property_tests/test_triton_kernels.py -m "not slow" > $OUT/pytest.log 2>&1
echo "pytest exit $?"; tail -3 $OUT/pytest.log
timeout 120 python3 devtools/profile_cases.py sdpa-flash 60 > $OUT/profile.log 2>&1; head -c 5000 $OUT/profile.log
s=$(date +%s)
timeout 240 python3 -m faverify fuzz --kernel triton --iters 300 --no-db --json $OUT/triton.json > $OUT/triton.log 2>&1
echo "triton exit $?: $(( $(date +%s) - s )) s"; grep -E "ms per case|cases/s, failed" $OUT/triton.log | tail -3
grep -A8 "== Failures ([1-9]" $OUT/triton.log | head -12
