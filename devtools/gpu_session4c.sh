# After the verdict floor change (largest element, not rms): the sdpa-cudnn dq case that failed at 1.07x
# the old floor, then 3000 more sdpa-cudnn cases with another seed (one H200, ~2 min).
. devtools/device_setup.sh
step() { local s=$(date +%s); timeout -s TERM "$@"; echo "  exit $? after $(( $(date +%s) - s )) s"; }
export FAVERIFY_CACHE=/tmp/fvcache
{
echo "== repro"; step 60 python3 -m faverify repro --kernel sdpa-cudnn --device cuda --case '{"batch":2,"seqlen_q":338,"seqlen_k":2,"nheads":2,"nheads_k":1,"head_dim":16,"dtype":"bf16","causal":false,"softmax_scale":0.001,"regime":"constant","layout":"transposed","init":"-1e30","seed":2782158}' 2>&1 | tail -12
echo "== sdpa-cudnn 3000"; step 70 python3 -m faverify fuzz --kernel sdpa-cudnn --iters 3000 --seed 1 --dtype bf16,fp16 --no-db \
  --workers 14 --json $OUT/cudnn3k.json > $OUT/cudnn3k.log 2>&1; grep -E -A3 "^kernel  " $OUT/cudnn3k.log | head -4
grep -E "^sdpa-cudnn: .* \(|minimal case|interrupted=" $OUT/cudnn3k.log | head -30
} 2>&1 | tee $OUT/log.txt
