# Session 6, issue 3: the Triton forward through tensor descriptors (TMA), swept over tiles next to
# sdpa-cudnn and sdpa-flash; then the GPU tests of the Triton kernels. One H200, ~6 min.
. devtools/device_setup.sh
step() { local s=$(date +%s); timeout -s TERM "$@"; echo "  exit $? after $(( $(date +%s) - s )) s"; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv
echo "== sweep bf16"; step 330 python3 devtools/triton_fwd_sweep.py --dtype bf16 --json $OUT/sweep_bf16.json 2>&1 | tee $OUT/sweep_bf16.txt | grep -E "^d|best|bits|Error|sweep done"
echo "== triton kernel tests on the GPU"; step 170 python3 -m pytest -q -m "not slow" property_tests/test_triton_kernels.py 2>&1 | tail -6
