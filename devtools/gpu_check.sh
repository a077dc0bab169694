#!/usr/bin/env bash
# The GPU checks of a change to the kernels or the verifier, in named, time-boxed steps, each writing its
# log (and JSON where the command makes one) into a folder:
#
#   bash devtools/gpu_check.sh OUTDIR [STEP ...]          (default: tests fuzz mutants)
#
# Steps (seconds allowed in brackets; FAVERIFY_CHECK_SCALE=0.5 halves every box):
#   tests      [540] the kernels' tests on this GPU: every GPU-marked test, and the conformance, Triton,
#                    CUDA, memory and mutant tests that run on any device (slow ones left out); on the H200
#                    119 of its 155 tests took 300 s (each Triton variant compiles on first use): a call of its own
#   gpu        [240] pytest -m gpu: only the GPU-marked tests (186 s on the H200)
#   memory     [ 90] the seqlen-65536 memory test alone
#   contracts  [ 90] the GPU-marked tests of the contract (property_tests/test_contracts.py: an output written
#                    on a stream the caller never waits for)
#   variants   [240] the variant kernels' tests (property_tests/test_triton_variants.py: the Hopper forward's
#                    windows and softcap among them)
#   fuzz       [560] faverify fuzz --kernel triton --iters 10000 --dtype bf16,fp16 --mode both (masks and biases
#                    in the draw: on the H200 a warm-up of 406 cases, 147 s, then about 80 cases/s)
#   census     [300] devtools/compile_census.py triton 600 after a 16-case fuzz has filled Triton's cache: the
#                    builds compiled after the warm-up (each one a compile in every worker) and a case's phases
#   fuzz-cold  [560] the fuzz step's run with an empty Triton cache of its own (OUTDIR/cold-cache): the warm-up
#                    compiles every build the draw can reach across the cores; the report's warm-up line and
#                    phase table say how long and where a case's time went
#   fuzz-warm  [300] the same run again on the cache fuzz-cold filled: the workers only load
#   warm-cache [550] faverify warmup --target sm_90 with the GPU hidden (CUDA_VISIBLE_DEVICES=), as on a machine
#                    without one, into OUTDIR/cpu-cache; then devtools/warm_cache.py 300 drawn cases on the GPU
#                    with TRITON_CACHE_DIR at it: builds loaded and compiled, and which key part differed; then
#                    the same for a cache a CPU machine built, carried as .warm-cache/ (faverify warmup --dtype
#                    bf16 --features none --mode fwd --gradcheck-every 0 --cache-dir .warm-cache --json
#                    .warm-cache/warmup.json), if there is one
#   fuzz-variants [300] the same, 4000 cases drawing only windows, softcap, ALiBi, sinks and v's head dim
#   fuzz-ragged [400] the same for triton-varlen and triton-paged, 200 s each
#   fuzz-ragged-full [560] triton-varlen at 10000 cases beside shard 0/2 of triton-paged's 10000, side by side
#                    (a paged case pages a cache of up to 2^17 keys: 10000 take two boxes; faverify merge)
#   fuzz-paged-rest [560] shard 1/2 of triton-paged's 10000, beside sdpa-flash, sdpa-cudnn and flex at 2000
#                    cases with every feature each declares
#   masks      [240] the mask and bias tests (property_tests/test_masks.py) and the variant kernels' tests
#   fuzz-masks [560] triton at 5000 cases drawing masks, biases and bias gradients only, beside sdpa-efficient,
#                    sdpa-cudnn and flex at 2000 cases with every feature each declares
#   fuzz-cuda  [200] the same for cuda,cuda-simt
#   fuzz-sdpa  [240] sdpa-flash, sdpa-efficient and sdpa-cudnn at 3000 cases each
#   floor      [300] devtools/floor_calibration.py: the tolerance floor each GPU subject needs, 400 cases each
#                    (bf16, fp16), one process per subject
#   mutants    [300] faverify mutants --iters 60 (every mutant that runs on this GPU, and the control)
#   mutants-full [540] faverify mutants --iters 1000
#   bench      [150] faverify bench --kernel triton --headdims 64,128 --seqlens 4096,16384 --dtype bf16,fp16
#   bench-variants [300] faverify bench --kernel triton,flex, bf16 d128 seqlen 16384 causal: dense, windows
#                    256, 1024, 4096, softcap 30, ALiBi and sinks (a variant's time against dense, speed
#                    against flex)
#   bench-decode [240] faverify bench --decode: triton-paged against sdpa-flash, sdpa-cudnn and flex, bf16 d128,
#                    caches 4k..128k, GQA 8, pages 16 and 64 (the cache read's bandwidth; 32 s on the H200)
#   fuzz-decode [300] triton-paged at 3000 cases (most through the decode kernel), and the decode kernel's tests
#   decode-sweep [300] devtools/decode_sweep.py: split counts (the rule's times 1-32, and 64) with the default
#                    tile, then the decode kernel's tiles (16 rows; 16, 32 or 64 keys a step, 2-8 warps, 1-3
#                    stages) at the fastest, on bench --decode's shapes, replayed from CUDA graphs (58 s on the
#                    H200 for caches 4096 and 131072)
#   decode-profile [120] devtools/decode_profile.py: each kernel's GPU time in a decode step of bench --decode's
#                    shapes (torch.profiler over replays of the step's CUDA graph)
#   bench-cuda [150] the same for cuda
#   doctor     [200] faverify doctor --level full
#   fuzz-fa4   [560] faverify fuzz --kernel flash-attn-4 --iters 10000 with every feature it declares, a shape
#                    budget of 32 and its own on-disk compile cache on (FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1),
#                    so its workers share each compile (needs the wheel set below)
#   bench-fa4  [200] faverify bench --kernel triton,flash-attn-4, d64 and d128 at 4096 and 16384, bf16, dense and
#                    window=1024, beside sdpa-cudnn (docs/flash-attn-4.md's table)
#   doctor-libs [300] faverify doctor --with flash-attn-4,flashinfer
#   flashinfer-prebuild [560] devtools/flashinfer_prebuild.py --dtypes bf16: the JIT modules a bf16 fuzz of the
#                    flashinfer subject reaches, in one ninja run (the wheel set from devtools/wheelset.py)
#   fuzz-flashinfer [560] faverify fuzz --kernel flashinfer --iters 10000 --dtype bf16 --mode fwd (after the
#                    prebuild, on the same warm machine: the modules stay in ~/.cache/flashinfer)
#   hopper-bwd [300] the Hopper dK/dV (hopper/backward.py, opt-in): its FP64 test and bit-equality on 40 drawn
#                    cases, then devtools/hopper_bwd_ab.py (against the Triton backward and sdpa-cudnn's)
#   hopper-bwd-fast [570] the Hopper backward's two modes as subjects: 1000-case fuzzes of triton-hopper-bwd-fast
#                    and triton-hopper-bwd (path counts: "bwd hopper fused-dq", "bwd hopper"), the deterministic
#                    mode's bits over 3 runs of 40 cases, the fast mode's 4 mutants at 300 cases (and the
#                    stage-reuse mutant's own fuzz: its cases' statuses and paths), and the backward's bench
#                    rows of both beside triton's, sdpa-flash's and sdpa-cudnn's
#   fused-bwd  [570] the fused Hopper backward (hopper/backward_fused.py, opt-in): a 10000-case fuzz of
#                    triton-hopper-bwd-fused (first: its warm-up compiles, over every core, the builds the
#                    steps after it load from Triton's cache), its GPU tests (FP64 on 40 drawn cases, dK and dV
#                    the same bits twice; against the Hopper dK/dV and the Triton dQ at each build), its two
#                    mutants at 300 cases, and its backward's bench rows beside triton's and the SDPA
#                    backends' (sdpa-cudnn's among them): bf16, d64 and d128, seqlens 4096 and 16384
#   backward-profile [150] devtools/backward_profile.py: each kernel's GPU time in one backward (triton, triton
#                    with the Hopper dK/dV, with its fused dQ, sdpa-cudnn, sdpa-flash) at bench's d64/d128,
#                    seqlens 4096 and 16384
#   sanitize   [240] compute-sanitizer memcheck and racecheck on devtools/sanitize_cases.py
#   between-calls [540] call sequences and relations on the GPU: triton at --sequence 8 --relations
#                    batch,decode,repeat (300 sequences), then sdpa-flash, sdpa-efficient, sdpa-cudnn and flex at
#                    --sequence 8 --relations batch,decode,repeat (150 each), and triton-paged at --relations splits
#   fp8        [120] sdpa-math's FP8 cases on the GPU (--features fp8, 500 cases): the control of the FP8 judge
#   fp8-kernel [480] the bundled FP8 forward (kernels/triton/fp8.py): its tests, a 10000-case fuzz of triton-fp8
#                    (--dtype fp8) and its three mutants
#   sparse     [450] the sparse-indices kernels (kernels/triton/sparse.py): their tests, a 2000-case fuzz of
#                    triton drawing sparse indices with the features that go with them, and their mutant (on
#                    the H200 the fuzz's warm-up took most of a 150 s box: 622 cases)
#   large      [560] faverify fuzz --scale large (offsets past 2^31 elements: docs/design.md) on triton,
#                    triton-paged, sdpa-flash, sdpa-cudnn, flex, and flash-attn-4 where flash_attn.cute imports:
#                    24 cases each, bf16 and fp16, one worker, a box of its own each (80 to 120 s)
#
# On the lent machine (no network) faverify is installed from the checkout without dependencies first, and
# a kernel library's wheel set carried under .whl/ (devtools/wheelset.py: its loads, over as many calls) is
# installed into .whl/site, on the PYTHONPATH of every step.
# One line per step goes to stdout: its name, exit code and seconds, then the lines of its log that carry
# the verdict; the whole log is OUTDIR/STEP.log.
set -u
if [ "${1:-}" = "--help" ] || [ -z "${1:-}" ]; then  # the header above is the help: steps, boxes, what they run
  sed -n '2,/^set -u/p' "$0" | grep '^#' | cut -c3-
  exit 0
fi
out=$1
shift
steps=${*:-tests fuzz mutants}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$out/install.log" 2>&1 \
  || { echo "install failed:"; tail -5 "$out/install.log"; exit 2; }
if ls .whl/load*/*.whl >/dev/null 2>&1 && [ ! -d .whl/site ]; then  # the loads' split wheels joined, then one install
  for first in .whl/load*/*.whl.part0; do
    [ -e "$first" ] || continue
    name=$(basename "$first" .part0)
    : > ".whl/$name"
    i=0
    while part=$(ls .whl/load*/"$name.part$i" 2>/dev/null) && [ -n "$part" ]; do
      cat "$part" >> ".whl/$name"
      i=$((i + 1))
    done
  done
  wheels=$(shopt -s nullglob; echo .whl/load*/*.whl .whl/*.whl)  # .whl/*.whl: the joined ones, if any were split
  python3 -m pip install -q --no-index --no-deps --no-compile --target .whl/site $wheels \
    >"$out/libraries.log" 2>&1 || { echo "library install failed:"; tail -5 "$out/libraries.log"; }
fi
if [ -d .whl/site ]; then
  export PYTHONPATH=$PWD/.whl/site:$(python3 devtools/wheelset.py --pth-dirs .whl/site)
fi
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, \
'gpus', torch.cuda.device_count(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'none')"

scale=${FAVERIFY_CHECK_SCALE:-1}
box() { python3 -c "print(max(10, int($1 * $scale)))"; }
run() {  # run NAME SECONDS GREP COMMAND...: one time-boxed step, its log in $out/NAME.log
  local name=$1 seconds; seconds=$(box "$2"); local pattern=$3; shift 3
  local start; start=$(date +%s)
  timeout -s TERM -k 10 "$seconds" "$@" >"$out/$name.log" 2>&1
  local code=$?
  echo "== $name: exit $code after $(( $(date +%s) - start )) s (box $seconds s)"
  grep -v -i "warn" "$out/$name.log" | grep -E "$pattern" | tail -n 12 | cut -c1-200
}
fuzz() {  # fuzz NAME SECONDS KERNELS ITERS
  run "$1" "$2" "passed|failed|cases/s|warm-up|code path|by phase|minimal case|signature|interrupted|^PASS|^FAIL|^INTERRUPTED" \
    python3 -m faverify fuzz --kernel "$3" --iters "$4" --dtype bf16,fp16 --mode both --no-db \
    --json "$out/$1.json"
}

for step in $steps; do
  case $step in
    tests) run tests 540 "passed|failed|error" python3 -m pytest -q -p no:cacheprovider -m "not slow" -rfs \
      property_tests/test_conformance.py property_tests/test_triton_kernels.py property_tests/test_cuda_kernels.py \
      property_tests/test_memory.py property_tests/test_mutants.py ;;
    gpu) run gpu 240 "passed|failed|error" python3 -m pytest -q -p no:cacheprovider -m gpu -rfs property_tests ;;
    variants) run variants 240 "passed|failed|error" python3 -m pytest -q -p no:cacheprovider -rfs \
      property_tests/test_triton_variants.py ;;
    memory) run memory 90 "MiB|passed|failed" python3 -m pytest -q -p no:cacheprovider -s property_tests/test_memory.py ;;
    contracts) run contracts 90 "passed|failed|error" python3 -m pytest -q -p no:cacheprovider -m gpu -rfs \
      property_tests/test_contracts.py ;;
    fuzz) fuzz fuzz 560 triton 10000 ;;
    census)
      python3 -m faverify fuzz --kernel triton --iters 16 --dtype bf16,fp16 --mode both --no-db >"$out/census-warm.log" 2>&1
      run census 300 "^warm-up|cases:|phase|builds compiled|^-- " python3 devtools/compile_census.py triton 600 ;;
    fuzz-cold) mkdir -p "$out/cold-cache"; rm -rf "$out/cold-cache"/*
      TRITON_CACHE_DIR=$out/cold-cache fuzz fuzz-cold 560 triton 10000 ;;
    fuzz-warm) TRITON_CACHE_DIR=$out/cold-cache fuzz fuzz-warm 300 triton 10000 ;;
    warm-cache)
      run warm-cache-build 330 "warm-up cases|failed|could not" env CUDA_VISIBLE_DEVICES= python3 -m faverify warmup \
        --kernel triton --target sm_90 --cache-dir "$out/cpu-cache" --json "$out/cpu-cache/warmup.json"
      run warm-cache 140 "^cache|same|DIFFERS|cases:|differs|no build" python3 devtools/warm_cache.py "$out/cpu-cache" \
        --cases 300
      if [ -f .warm-cache/warmup.json ]; then
        run warm-cache-carried 80 "^cache|same|DIFFERS|cases:|differs|no build" python3 devtools/warm_cache.py \
          .warm-cache --cases 100 --dtype bf16 --features none --mode fwd
      fi ;;
    fuzz-variants) run fuzz-variants 300 "passed|failed|cases/s|warm-up|code path|by phase|minimal case|signature|interrupted" \
      python3 -m faverify fuzz --kernel triton --iters 4000 --features window,softcap,alibi,sinks,head_dim_v \
      --dtype bf16,fp16 --mode both --no-db --json "$out/fuzz-variants.json" ;;
    fuzz-ragged) fuzz fuzz-varlen 200 triton-varlen 10000; fuzz fuzz-paged 200 triton-paged 10000 ;;
    fuzz-ragged-full)
      fuzz fuzz-varlen 560 triton-varlen 10000 &
      run fuzz-paged-0 560 "passed|failed|cases/s|warm-up|code path|by phase|minimal case|signature|interrupted" \
        python3 -m faverify fuzz --kernel triton-paged --iters 10000 --shard 0/2 --dtype bf16,fp16 --mode both \
        --no-db --json "$out/fuzz-paged-0.json" &
      wait ;;
    fuzz-paged-rest)
      run fuzz-paged-1 560 "passed|failed|cases/s|warm-up|code path|by phase|minimal case|signature|interrupted" \
        python3 -m faverify fuzz --kernel triton-paged --iters 10000 --shard 1/2 --dtype bf16,fp16 --mode both \
        --no-db --json "$out/fuzz-paged-1.json" &
      fuzz fuzz-sdpa-variants 560 sdpa-flash,sdpa-cudnn,flex 2000 &
      wait ;;
    masks) run masks 240 "passed|failed|error" python3 -m pytest -q -p no:cacheprovider -rfs \
      property_tests/test_masks.py property_tests/test_triton_variants.py ;;
    fuzz-masks)
      run fuzz-masks-triton 560 "passed|failed|cases/s|warm-up|code path|by phase|minimal case|signature|interrupted" \
        python3 -m faverify fuzz --kernel triton --iters 5000 --features mask,bias,bias_grad --dtype bf16,fp16 \
        --mode both --no-db --json "$out/fuzz-masks-triton.json" &
      fuzz fuzz-masks-sdpa 560 sdpa-efficient,sdpa-cudnn,flex 2000 &
      wait ;;
    fuzz-cuda) fuzz fuzz-cuda 200 cuda,cuda-simt 10000 ;;
    fuzz-sdpa) fuzz fuzz-sdpa 240 sdpa-flash,sdpa-efficient,sdpa-cudnn 3000 ;;
    floor)  # one process per subject, side by side
      for k in sdpa-flash sdpa-efficient sdpa-cudnn triton cuda; do
        run "floor-$k" 300 "^sdpa|^triton|^cuda|needed" python3 devtools/floor_calibration.py --device cuda \
          --kernels "$k" --n 400 --dtypes bf16,fp16 --json "$out/floor-$k.json" &
      done
      wait ;;
    mutants) run mutants 300 "^killed|^control|SURVIVED|NOT " python3 -m faverify mutants --iters 60 \
      --json "$out/mutants.json" ;;
    mutants-full) run mutants-full 540 "^killed|^control|SURVIVED|NOT " python3 -m faverify mutants --iters 1000 \
      --json "$out/mutants-full.json" ;;
    bench-decode) run bench-decode 240 "^triton|^sdpa|^flex|copy|passed|failed" python3 -m faverify bench --decode \
      --headdims 128 --dtype bf16 --json "$out/bench-decode.json" ;;
    fuzz-decode)
      run fuzz-decode 240 "passed|failed|cases/s|warm-up|code path|by phase|minimal case|signature|interrupted" \
        python3 -m faverify fuzz --kernel triton-paged --iters 3000 --dtype bf16,fp16 --mode both --no-db \
        --json "$out/fuzz-decode.json"
      run decode-tests 60 "passed|failed|error" python3 -m pytest -q -p no:cacheprovider -rfs \
        property_tests/test_triton_variants.py -k packed_decode ;;
    decode-profile) run decode-profile 120 "^d[0-9]" python3 devtools/decode_profile.py ;;
    decode-sweep) run decode-sweep 300 "^device|^d[0-9]" python3 devtools/decode_sweep.py \
      --json "$out/decode-sweep.json" ;;
    bench) run bench 150 "^triton|^sdpa|passed|failed" python3 -m faverify bench --kernel triton --headdims 64,128 \
      --seqlens 4096,16384 --dtype bf16,fp16 --no-tune --json "$out/bench.json" ;;
    bench-variants) run bench-variants 300 "^triton|^flex|passed|failed" python3 -m faverify bench \
      --kernel triton,flex --headdims 128 --seqlens 16384 --dtype bf16 --causal true --no-tune \
      --variants dense,window=256,window=1024,window=4096,softcap=30,alibi,sinks --json "$out/bench-variants.json" ;;
    bench-cuda) run bench-cuda 150 "^cuda|^sdpa|passed|failed" python3 -m faverify bench --kernel cuda \
      --headdims 64,128 --seqlens 4096,16384 --dtype bf16,fp16 --no-tune --json "$out/bench-cuda.json" ;;
    doctor) run doctor 200 "Pass|Fail|Warn" python3 -m faverify doctor --level full --json "$out/doctor.json" ;;
    fuzz-fa4) run fuzz-fa4 560 "passed|failed|cases/s|code path|minimal case|signature|interrupted" \
      env FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1 python3 -m faverify fuzz --kernel flash-attn-4 --iters 10000 --shapes 32 --dtype bf16,fp16 --mode both --no-db --json "$out/fuzz-fa4.json" ;;
    bench-fa4) run bench-fa4 200 "^triton|^flash|^sdpa-cudnn|passed|failed" python3 -m faverify bench \
      --kernel triton,flash-attn-4 --headdims 64,128 --seqlens 4096,16384 --dtype bf16 --no-tune \
      --variants dense,window=1024 --json "$out/bench-fa4.json" ;;
    doctor-libs) run doctor-libs 300 "Pass|Fail|Warn|Skip" python3 -m faverify doctor --with flash-attn-4,flashinfer \
      --json "$out/doctor-libs.json" ;;
    flashinfer-prebuild) run flashinfer-prebuild 560 "modules built|Error|error" \
      python3 devtools/flashinfer_prebuild.py --dtypes bf16 ;;
    fuzz-flashinfer) run fuzz-flashinfer 560 "passed|failed|cases/s|code path|minimal case|signature|interrupted" \
      python3 -m faverify fuzz --kernel flashinfer --iters 10000 --dtype bf16 --mode fwd --no-db \
      --json "$out/fuzz-flashinfer.json" ;;
    hopper-bwd)
      run hopper-bwd-tests 150 "passed|failed|error" python3 -m pytest -q -p no:cacheprovider -rfs \
        property_tests/test_triton_kernels.py -k hopper_backward
      run hopper-bwd-ab 150 "TF/s|DIFFER|Error" python3 devtools/hopper_bwd_ab.py --repeats 2 ;;
    hopper-bwd-fast)
      run fuzz-hopper-bwd-fast 140 "passed|failed|cases/s|code path|by phase|minimal case|signature|interrupted" \
        python3 -m faverify fuzz --kernel triton-hopper-bwd-fast,triton-hopper-bwd --iters 1000 --dtype bf16,fp16 \
        --mode both --no-db --json "$out/fuzz-hopper-bwd-fast.json"
      run repeat-hopper-bwd 40 "passed|failed|nondeterministic|cases/s" python3 -m faverify fuzz \
        --kernel triton-hopper-bwd --iters 40 --repeat 3 --mode bwd --no-db
      run mutants-hopper-bwd 180 "killed|survived|control|Error" python3 -m faverify mutants --iters 300 \
        --only hopper-bwd-stage-reused-early,hopper-bwd-ds-no-fence,hopper-bwd-dk-unscaled,hopper-bwd-dq-drops-last-key-tile \
        --dtype bf16,fp16 --timeout 60 --json "$out/mutants-hopper-bwd.json"
      # what the mutants' table leaves out: the statuses, errors and paths of a surviving mutant's cases
      run mutant-stage-reused 40 "^PASS|^FAIL|own errors|code path|skipped|crash" python3 -m faverify fuzz \
        --kernel mutant:hopper-bwd-stage-reused-early --iters 60 --dtype bf16,fp16 --mode both --no-db \
        --json "$out/mutant-stage-reused.json"
      run bench-hopper-bwd 170 "^triton|^sdpa|passed|failed" python3 -m faverify bench \
        --kernel triton,triton-hopper-bwd,triton-hopper-bwd-fast --headdims 64,128 --seqlens 4096,16384 \
        --dtype bf16,fp16 --mode bwd --no-tune --json "$out/bench-hopper-bwd.json" ;;
    fused-bwd)
      run fuzz-fused-bwd 220 "passed|failed|cases/s|warm-up|code path|by phase|minimal case|signature|interrupted" \
        python3 -m faverify fuzz --kernel triton-hopper-bwd-fused --iters 10000 --dtype bf16,fp16 --mode both \
        --timeout 60 --no-db --json "$out/fuzz-fused-bwd.json"
      run fused-bwd-tests 100 "passed|failed|error" python3 -m pytest -q -p no:cacheprovider -m gpu -rfs \
        property_tests/test_fused_backward.py
      run mutants-fused-bwd 140 "killed|survived|control|Error" python3 -m faverify mutants --iters 300 \
        --control-iters 100 --only fused-bwd-reduce-before-dq,fused-bwd-dv-reset-per-tile --dtype bf16,fp16 \
        --timeout 60 --json "$out/mutants-fused-bwd.json"
      run bench-fused-bwd 100 "^triton|^sdpa|passed|failed" python3 -m faverify bench \
        --kernel triton,triton-hopper-bwd-fused --headdims 64,128 --seqlens 4096,16384 --dtype bf16 --mode bwd \
        --no-tune --json "$out/bench-fused-bwd.json" ;;
    backward-profile) run backward-profile 150 "^bf16|^fp16|Error" python3 devtools/backward_profile.py ;;
    sanitize)
      for tool in memcheck racecheck; do
        run "sanitize-$tool" 120 "ERROR SUMMARY|hazard|error" compute-sanitizer --tool "$tool" \
          python3 devtools/sanitize_cases.py
      done ;;
    between-calls)
      run between-triton 150 "^PASS|^FAIL|sequences,|relations checked|minimal case|interrupted" python3 -m faverify \
        fuzz --kernel triton --sequence 8 --iters 300 --relations batch,decode,repeat --dtype bf16,fp16 --no-db \
        --json "$out/between-triton.json"
      run between-libraries 270 "^PASS|^FAIL|sequences,|relations checked|minimal case|interrupted" python3 -m \
        faverify fuzz --kernel sdpa-flash,sdpa-efficient,sdpa-cudnn,flex --sequence 8 --iters 150 \
        --relations batch,decode,repeat --dtype bf16,fp16 --no-db --json "$out/between-libraries.json"
      run between-splits 120 "^PASS|^FAIL|relations checked|minimal case|interrupted" python3 -m faverify fuzz \
        --kernel triton-paged --iters 1000 --relations splits --dtype bf16,fp16 --no-db \
        --json "$out/between-splits.json" ;;
    fp8) run fp8 120 "^PASS|^FAIL|cases per feature|minimal case|interrupted" python3 -m faverify fuzz \
      --kernel sdpa-math --features fp8 --iters 500 --dtype bf16 --no-db --json "$out/fp8.json" ;;
    fp8-kernel)
      run fp8-kernel-tests 90 "passed|failed|error" python3 -m pytest -q -p no:cacheprovider -rfs \
        property_tests/test_triton_fp8.py
      run fp8-kernel 300 "^PASS|^FAIL|FP8 cases|minimal case|interrupted" python3 -m faverify fuzz \
        --kernel triton-fp8 --dtype fp8 --iters 10000 --no-db --json "$out/fp8-kernel.json"
      run fp8-kernel-mutants 60 "killed|SURVIVED|control" python3 -m faverify mutants \
        --only fp8-v-descale-ignored,fp8-p-unscaled,fp8-q-descale-twice --iters 200 ;;
    sparse)
      run sparse-tests 90 "passed|failed|error" python3 -m pytest -q -p no:cacheprovider -rfs \
        property_tests/test_triton_variants.py -k "sparse or max_logit"
      run sparse 300 "^PASS|^FAIL|cases per feature|code path|minimal case|interrupted" python3 -m faverify fuzz \
        --kernel triton --features sparse,head_dim_v,lse_grad,max_logit --iters 2000 --dtype bf16,fp16 --mode both \
        --no-db --json "$out/sparse.json"
      run sparse-mutant 60 "killed|SURVIVED|control" python3 -m faverify mutants --only sparse-minus-one-as-key-0 \
        --iters 200 ;;
    large)
      for pair in triton:100 triton-paged:80 sdpa-flash:80 sdpa-cudnn:80 flex:120 flash-attn-4:100; do
        kernel=${pair%%:*}
        if [ "$kernel" = flash-attn-4 ] && ! python3 -c "import flash_attn.cute" 2>/dev/null; then
          echo "== large-$kernel: not run (flash_attn.cute does not import)"
          continue
        fi
        run "large-$kernel" "${pair##*:}" "^PASS|^FAIL|passed|failed|too large|minimal case|signature|interrupted" \
          python3 -m faverify fuzz --kernel "$kernel" --scale large --iters 24 --dtype bf16,fp16 --shapes 0 \
          --shrink-budget 4 --timeout 120 --no-db --json "$out/large-$kernel.json"
      done ;;
    *) echo "unknown step: $step (steps: $(grep -oE '^    [a-z0-9-]+\)' "$0" | tr -d ' )' | tr '\n' ' '))"
       exit 2 ;;
  esac
done
