# Session 5, second step on the CUDA kernels (cp.async without the pointer select; recompute_p as one fma),
# timed and checked in one call on nvidia-h200-x2, two streams side by side:
#   GPU 0, cores 0-15: cuda_tune.py (d128 bf16, next to sdpa-flash); the CUDA fuzz at 10000 cases.
#   GPU 1, cores 16-31: memcheck and racecheck (both variants: recompute_p is shared); bench cuda; pytest -m gpu.
. devtools/device_setup.sh
step() { local s=$(date +%s); timeout -s TERM "$@"; echo "  exit $? after $(( $(date +%s) - s )) s"; }
export FAVERIFY_CACHE=/tmp/fvcache
python3 -c "import torch; from faverify.kernels.cuda import build; build.load(torch.cuda.get_device_capability())"
(
  export CUDA_VISIBLE_DEVICES=0
  echo "== tune"; step 80 taskset -c 0-15 python3 devtools/cuda_tune.py --label session5e 2>&1 | grep -v -i warn
  echo "== fuzz cuda"; step 220 taskset -c 0-15 python3 -m faverify fuzz --kernel cuda,cuda-simt --iters 10000 --dtype bf16,fp16 \
    --mode both --no-db --json $OUT/fuzz_cuda.json 2>&1 | grep -v "cases/s, failed" | tail -8
) > $OUT/stream0.log 2>&1 &
(
  export CUDA_VISIBLE_DEVICES=1
  SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  for tool in memcheck racecheck; do echo "== $tool"; step 100 taskset -c 16-31 $SAN --tool $tool python3 devtools/sanitize_cases.py 2>&1 | tail -3; done
  echo "== bench cuda"; step 90 taskset -c 16-31 python3 -m faverify bench --kernel cuda --headdims 64,128 --seqlens 4096,16384 \
    --dtype bf16,fp16 --no-tune --json $OUT/bench_cuda.json 2>&1 | grep -E "^cuda |^kernel" | head -20
  echo "== pytest -m gpu"; step 150 taskset -c 16-31 python3 -m pytest -q -p no:cacheprovider -m gpu -rs property_tests 2>&1 | tail -3
) > $OUT/stream1.log 2>&1 &
wait; cat $OUT/stream0.log; cat $OUT/stream1.log
