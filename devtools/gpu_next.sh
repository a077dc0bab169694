# What session 9 leaves (docs/measurements.md, "Session 9"): the one forward row at the 0.9x cuDNN line
# (bf16 d64 causal 4096: 0.88 in session 9's bench, 0.87-0.91 in its sweeps) measured in four separate
# bench runs, and the Gluon forward's 6 mutants on its two builds (forward_hopper.kernel). One H200, ~4 min.
. devtools/device_setup.sh
for i in 1 2 3 4; do
  timeout -s TERM 60 python3 -m faverify bench --kernel triton --headdims 64 --seqlens 4096 --causal true \
    --dtype bf16,fp16 --mode fwd --no-tune > $OUT/bench$i.log 2>&1
  echo "bench run $i: exit $?"; grep -E "^triton|^sdpa-cudnn" $OUT/bench$i.log | awk '{print $1, $2, $6, $8}'
done
timeout -s TERM 150 python3 -m faverify mutants --iters 40 --json $OUT/mutants.json \
  --only ws-no-neg-inf-guard,ws-no-rescale,ws-causal-top-left,ws-tail-tile-unmasked,ws-skip-own-diagonal,ws-consumer-rows > $OUT/mutants.log 2>&1
echo "mutants: exit $?"; grep -v -i warn $OUT/mutants.log | grep -E "^ws-|^killed" | cut -c1-120
