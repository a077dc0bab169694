# Session 4's GPU checks on nvidia-h200-x2, two streams side by side (5.5 min), each step time-boxed:
#   GPU 0, cores 0-19: pytest -m gpu; the Triton fuzz at 10000 cases (bf16, fp16, fp32: the fp32 tiles).
#   GPU 1, cores 20-31: the CUDA fuzz at 10000 cases; memcheck and racecheck (the tensor-core variant,
#                      whose tiles changed); bench cuda; bench triton (tuned, fwd).
# As run, it also timed an A/B of a Triton forward change measured slower and not kept
# (docs/measurements.md, "Session 4"); that step is left out here.
# At most 8 files come back: one log per stream and the JSON of the runs.
. devtools/device_setup.sh
step() { local s=$(date +%s); timeout -s TERM "$@"; echo "  exit $? after $(( $(date +%s) - s )) s"; }
export FAVERIFY_CACHE=/tmp/fvcache
python3 -c "import torch; from faverify.kernels.cuda import build; build.load(torch.cuda.get_device_capability())"
(
  export CUDA_VISIBLE_DEVICES=0
  echo "== pytest -m gpu"; step 170 taskset -c 0-19 python3 -m pytest -q -p no:cacheprovider -m gpu -rs property_tests 2>&1 | tail -15
  echo "== fuzz triton"; step 330 taskset -c 0-19 python3 -m faverify fuzz --kernel triton --iters 10000 \
    --dtype bf16,fp16,fp32 --mode both --no-db --json $OUT/fuzz_triton.json 2>&1 | grep -v "cases/s, failed" | tail -40
) > $OUT/stream0.log 2>&1 &
(
  export CUDA_VISIBLE_DEVICES=1
  echo "== fuzz cuda"; step 120 taskset -c 20-31 python3 -m faverify fuzz --kernel cuda --iters 10000 --dtype bf16,fp16 \
    --mode both --no-db --json $OUT/fuzz_cuda.json 2>&1 | grep -v "cases/s, failed" | tail -30
  SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  for tool in memcheck racecheck; do echo "== $tool"; step 100 taskset -c 20-31 $SAN --tool $tool python3 devtools/sanitize_cases.py mma 2>&1 | tail -3; done
  echo "== bench cuda"; step 70 taskset -c 20-31 python3 -m faverify bench --kernel cuda --headdims 128 --seqlens 4096,16384 \
    --dtype bf16,fp16 --no-tune --json $OUT/bench_cuda.json 2>&1 | tail -25
  echo "== bench triton fwd"; step 120 taskset -c 20-31 python3 -m faverify bench --kernel triton --mode fwd --headdims 64,128 \
    --seqlens 4096,16384 --dtype bf16 --json $OUT/bench_triton.json 2>&1 | tail -25
) > $OUT/stream1.log 2>&1 &
wait; tail -30 $OUT/stream0.log; tail -60 $OUT/stream1.log
