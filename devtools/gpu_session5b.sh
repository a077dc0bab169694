# Session 5: time the CUDA kernels after an instruction-count change (devtools/cuda_tune.py at d128, bf16,
# against sdpa-flash in the same process), then a short CUDA fuzz for correctness. One H200, ~3 min.
. devtools/device_setup.sh
step() { local s=$(date +%s); timeout -s TERM "$@"; echo "  exit $? after $(( $(date +%s) - s )) s"; }
export FAVERIFY_CACHE=/tmp/fvcache
{
echo "== build"; step 120 python3 -c "import torch; from faverify.kernels.cuda import build; build.load(torch.cuda.get_device_capability())"
echo "== tune"; step 150 python3 devtools/cuda_tune.py --label "${LABEL:-session5}" --seqlens 4096,16384
echo "== fuzz cuda"; step 100 python3 -m faverify fuzz --kernel cuda --iters 2000 --dtype bf16,fp16 --mode both --no-db 2>&1 \
  | grep -v "cases/s, failed" | tail -12
} 2>&1 | tee $OUT/log.txt
