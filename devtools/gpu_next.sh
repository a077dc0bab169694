# What session 10 leaves (docs/measurements.md, "Session 10"): the forward row with the least margin (fp16
# d128 non-causal 4096, median 0.903x cuDNN over six runs) in three more separate runs, and the two devtools
# scripts whose shared timing block moved (gluon_specialize.bench_row) run once each: untested on the GPU
# after the move. gluon_ab.py needs an old kernel file first (here: the current one, so its bits must be the
# same). One H200, ~4 min.
. devtools/device_setup.sh
for i in 1 2 3; do
  timeout -s TERM 60 python3 -m faverify bench --kernel triton --headdims 128 --seqlens 4096 --causal false \
    --dtype bf16,fp16 --mode fwd --no-tune > $OUT/bench$i.log 2>&1
  echo "bench run $i: exit $?"; grep -E "^triton|^sdpa-cudnn" $OUT/bench$i.log | awk '{print $1, $2, $3, $4, $6}'
done
cp kernels/triton/forward_hopper.py /tmp/forward_hopper_same.py
timeout -s TERM 120 python3 devtools/gluon_ab.py /tmp/forward_hopper_same.py --repeats 1 > $OUT/ab.log 2>&1
echo "gluon_ab: exit $?"; grep -v -i warn $OUT/ab.log | grep -E "bits: |cudnn|run"
timeout -s TERM 120 python3 devtools/gluon_specialize.py > $OUT/spec.log 2>&1
echo "gluon_specialize: exit $?"; grep -v -i warn $OUT/spec.log | grep -E "cudnn|launched"
