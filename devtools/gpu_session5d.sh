# Session 5: checks of the committed CUDA kernels (loader and mask changes) on nvidia-h200-x2, two streams:
#   GPU 0, cores 0-15: the CUDA fuzz at 10000 cases (cuda, cuda-simt); memcheck and racecheck; bench cuda.
#   GPU 1, cores 16-31: pytest -m gpu; two tile knobs again (cuda_tune.py): dkdv 8 warps, dq key tile 48.
. devtools/device_setup.sh
step() { local s=$(date +%s); timeout -s TERM "$@"; echo "  exit $? after $(( $(date +%s) - s )) s"; }
export FAVERIFY_CACHE=/tmp/fvcache
python3 -c "import torch; from faverify.kernels.cuda import build; build.load(torch.cuda.get_device_capability())"
(
  export CUDA_VISIBLE_DEVICES=0
  echo "== fuzz cuda"; step 200 taskset -c 0-15 python3 -m faverify fuzz --kernel cuda,cuda-simt --iters 10000 --dtype bf16,fp16 \
    --mode both --no-db --json $OUT/fuzz_cuda.json 2>&1 | grep -v "cases/s, failed" | tail -30
  SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  for tool in memcheck racecheck; do echo "== $tool"; step 100 taskset -c 0-15 $SAN --tool $tool python3 devtools/sanitize_cases.py mma 2>&1 | tail -3; done
  echo "== bench cuda"; step 90 taskset -c 0-15 python3 -m faverify bench --kernel cuda --headdims 64,128 --seqlens 4096,16384 \
    --dtype bf16,fp16 --no-tune --json $OUT/bench_cuda.json 2>&1 | tail -25
) > $OUT/stream0.log 2>&1 &
(
  export CUDA_VISIBLE_DEVICES=1
  echo "== pytest -m gpu"; step 200 taskset -c 16-31 python3 -m pytest -q -p no:cacheprovider -m gpu -rs property_tests 2>&1 | tail -15
  for defs in "-DFA_DKDV_WARPS=8" "-DFA_DQ_BN128=48"; do
    echo "== $defs"; FAVERIFY_CUDA_DEFINES="$defs" timeout 100 taskset -c 16-31 python3 devtools/cuda_tune.py --label "$defs" 2>&1 | grep '^{'
  done
) > $OUT/stream1.log 2>&1 &
wait; cat $OUT/stream0.log; cat $OUT/stream1.log
