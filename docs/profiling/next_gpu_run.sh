#!/bin/bash
# GPU work for the next session, one call each (the device allows 600 s per call; a machine's
# start takes 1-3 of the session's 30 minutes; it is given back 30 s after a call ends, so have
# the next call ready; carry .gpu, built with `../shared/tools/gpu-bundle
# flash-linear-attention==0.6.0 fla-core==0.6.0`, and .prof, from `bash next_gpu_run.sh prep`).
# Session 27 ran session 26's list (runs 120-122) and the model steps (runs 123-124); session 28
# got an H100 late (runs 125-126); session 29 one H200 call late (run 127); session 30 an H100
# (runs 129-133); session 31 had no device time; session 32 an H100 (runs 134-140: the window-1024
# entry, attention's D64 causal forward on four blocks an SM, bulk-dq again, the GPT-OSS step);
# session 33 had no device (loans paused); session 34 none either (every start failed); session
# 35 an H100 for eight calls (runs 141-147: the attention tests with bulk_dq, the D64 bwd tunes,
# rmsnorm's recompute and forward probe), then no start again; session 36 an H100 (runs 148-151:
# the heads-fastest causal backward measured, 19% off gqa's, and tested; the causal forward's
# launch order A/B); session 37 an H100 (runs 152-161: the forward's grid tested, benches, D128
# re-tunes (no change), ncu, the rotated full backward: right but 1.7x slower); session 38 an
# H100 (runs 162-165: the backward probes, descending walks and no safe-memory pass landed,
# tested, benched), then no start; session 39 an H100 after two refused starts (runs 166-173:
# heads at a time dropped, dS without the scale, three backward entries re-tuned); session 40 an
# H100 (runs 174-177: the tests as landed, the ping-pong forward probed, landed, tested and
# benched against overlapped copies); session 41 an H100 after thirteen refused calls (runs
# 178-181: the ping-pong backward right and not faster; rmsnorm's "auto" tested, benched and
# shipped; the window-1024 ncu gave no profile); session 42 an H100, then an H200 (runs 182-189:
# windowed blocks fastest, the cluster backward and heads-outer walks all slower; the window
# backward's ncu; every generated test green on the H200; H200 benches); session 43 an H100 after
# 95 minutes of failed starts (runs 190-195: symbolic vs static kernels, the backwards level or
# faster, the D128 forwards 5-6% slower from the ping-pong forward's guarded O stores; two dQ
# stages no faster); session 44 an H100 for four calls (runs 196-199: the staged O tested, faster
# and landed; the causal forward's last 5% is its mask), then no start; session 45 none (every
# start refused or failed for two hours, 1500 of its 1800 s spent on them); session 46 an H200
# after five failed starts (runs 200-204: mask-bounds tested and merged, symbolic within 1.05% of
# static; the ping-pong window forward landed, 1.69x FlexAttention; heads-outer window backward
# and two-stage sinks backward dropped); session 47 an H100 after six failed starts
# (runs 205-208: the ping-pong backward without turns dropped; each backward's kernels against
# cuDNN's; the public rmsnorm backward kernel-bound; every family's bench in one call; rmsnorm's
# backward with its dw sums in registers, 1.04-1.10x, on branch rmsnorm-dw-registers); session 48
# an H100 (runs 209-215: rmsnorm's registers backward tested, re-tuned and merged, 95.5-96.5% of
# the copy; the vectorized dQ postprocess and the wide dsinks kernel A/B'd, tested and merged; the
# benches as merged; the windowed backwards' stalls; the gpt-oss backward kernel by kernel); session
# 49 rebuilt session 48's bwd-cast-dq branch (lost with its checkout) and landed it on main, off
# by default; no device started for it in 90 minutes of tries (the failed starts spent its 1800 s
# of device time); session 50 an H100 after ~30 minutes of failed starts (runs 216-219:
# cast_dq_in_bwd right and 1.1-2.2x slower in both designs, counting each step and counting once
# after the walk, so removed; dsinks summed in the preprocess right and no faster on the GPU,
# kept off by default behind [tiling.dsinks] in_preprocess); session 51 an H100 (runs 220-223:
# dsinks in the preprocess no faster through the whole call, so removed; the attention packages'
# 276 tests; the preprocess and postprocess at the copy bandwidth at any tiling; dQ by a kernel
# of its own right and slower everywhere); session 52 an H100 after six failed starts (runs
# 224-227: matmul's backward on the GPU is cuBLAS's, 2754 vs 2767 us at 8192^3; the swizzle panels
# within the drift of the timing order, so the generated benches now take turns; the D128 full
# backward's SASS stalls); session 53 none (eleven failed starts, ~990 of its 1800 s, and loans
# paused between them); it readied the ping-pong forward on 176-192 key rows and an 80-row
# backward; session 54 an H100 twice after five failed starts (runs 228-229: 192 key rows the
# fastest D128 forward, landed in attention and gqa; the 80-row backward right and no faster;
# no device time left for the tests); session 55 an H100 after nine failed starts (runs 230-233:
# attention_sink's D128 forwards on 192 key rows tested and landed, the three attention packages'
# 276 tests green on an H100, the gqa and sinks benches in turns; the D64 forwards on the
# ping-pong forward no faster, so item 4 is done); session 56 none (loans paused): it packed the
# kernels built on the CPU into .prof for the prebuild to load (item 0). Left, in order:
#   0. Before the session's first call, on the CPU machine (session 56 packed one; repack after a
#      kernel change, else those kernels build on the GPU machine as before):
#      `bash docs/profiling/next_gpu_run.sh pack-cache attention gqa attention_sink matmul rmsnorm
#      swiglu scaled_silu linear_attention` (11 min), so that the prebuild below loads the kernels
#      instead of spending ~150 s of the call building them. The first call's log says whether
#      the carried entries loaded ("carried cache: N kernels", then the prebuild's "already in
#      TileLang's cache" count); untried on a GPU so far.
#   1. Every generated test on the H200 (the acceptance's machine; runs 209-233 were on H100s):
#      all eight packages in one call, ~420 s on an H200 (runs 187-188: prebuild 107 + 41 s,
#      tests 212 + 54 s): `PREBUILD_TIMEOUT=220 TESTS_TIMEOUT=340 bash docs/profiling/next_gpu_run.sh
#      tests attention gqa attention_sink matmul rmsnorm swiglu scaled_silu linear_attention`; a
#      call can check `nvidia-smi --query-gpu=name` first and run something else on an H100.
#   2. Every family's bench on the H200 with the benches taking turns (in_turns): `BENCH_TIMEOUT=200
#      bash docs/profiling/next_gpu_run.sh bench attention gqa attention_sink` (gqa 74 s and
#      attention_sink 52 s on a warm H100, runs 232-233; attention's four cases ~150 s), then
#      `... bench rmsnorm scaled_silu swiglu matmul linear_attention` (PREBUILD=1 where no tests
#      call came first).
#   3. The attention backward's main kernel (0.85x cuDNN's at MHA D128 full): its stalls (run 225)
#      are GEMM waits (26.6% of the consumers' samples) and the dQ atomics (14.8%); every schedule
#      tried so far is listed in BENCHMARKS.md, "Targets not reached" (the 80-row step with dQ
#      transposed too, run 229).
# The two-GPU tests need the nvidia-h200-x2 machine: python -m pytest tests/test_two_gpus.py -v
cd "$(dirname "$0")/../.."
what=$1; shift
if [ "$what" = prep ]; then
  site=$(python -c "import typer, os; print(os.path.dirname(os.path.dirname(typer.__file__)))")
  mkdir -p .prof/site
  for p in typer rich click shellingham markdown_it mdurl pygments annotated_doc typing_extensions.py; do
    cp -r "$site/$p" .prof/site/
  done
  find .prof/site -name __pycache__ -type d -prune -exec rm -rf {} +
  exit 0
fi
if [ "$what" = pack-cache ]; then
  # On the CPU machine: every kernel variant of the named packages built for sm_90a into a TileLang
  # cache of its own (prebuild_kernels.py; 11 min on 2 cores for all eight), packed into .prof
  # (a few MB: cubins and host libraries compress ~27x). A call that carries .prof loads them
  # (below) instead of building them on the GPU machine, where the prebuild of the eight took
  # 148 s of an H200 call (runs 187-188). TileLang keys an entry on the kernel's TIR, target, pass
  # configs, its own version and the platform, not on the machine that built it; an entry that
  # fails to load there is a miss, built again.
  export TILELANG_DEFAULT_TARGET='{"kind": "cuda", "arch": "sm_90a"}'
  rm -rf /tmp/opgen-tlcache
  TILELANG_CACHE_DIR=/tmp/opgen-tlcache python docs/profiling/prebuild_kernels.py "$@" || exit 1
  tar -cf - -C /tmp/opgen-tlcache . | xz -9 -T2 > .prof/tilelang-cache.tar.xz
  exit 0
fi
export PYTHONPATH="$PYTHONPATH:$(pwd)/.prof/site"
python -c "import opgen.templates" 2>/dev/null || ln -s ../templates opgen/templates
L=${OUT:-.}/next_gpu_run.log
start=$(date +%s)
# One target for every mode's kernels: TileLang's cache key holds it, so the kernels prebuild
# (below), the tests, the benches and opgen tune build are loaded by the others.
export TILELANG_DEFAULT_TARGET='{"kind": "cuda", "arch": "sm_90a"}'
# The kernels pack-cache built on the CPU machine, where .prof carries them, added to this call's
# TileLang cache (.gpu/env.sh names it): TileLang loads each (the prebuild's "already in TileLang's
# cache" counts them) instead of building it.
if [ -f .prof/tilelang-cache.tar.xz ]; then
  export TILELANG_CACHE_DIR=${TILELANG_CACHE_DIR:-/tmp/tilelang-cache}
  mkdir -p "$TILELANG_CACHE_DIR" && tar -xJf .prof/tilelang-cache.tar.xz -C "$TILELANG_CACHE_DIR"
  echo "carried cache: $(find "$TILELANG_CACHE_DIR" -name executable.so | wc -l) kernels at $(( $(date +%s) - start )) s" >> $L
fi
prebuild() {
  timeout ${PREBUILD_TIMEOUT:-240} python docs/profiling/prebuild_kernels.py "$@" >> $L 2>&1
  echo "prebuild rc=$? at $(( $(date +%s) - start )) s" >> $L
}
if [ "$what" = tune ]; then
  for s in "$@"; do
    echo "=== [$(( $(date +%s) - start )) s] opgen tune specs/$s.toml -j 16 $TUNE_ARGS" >> $L
    # The whole log straight into $OUT: a call that runs out of time still brings it back.
    timeout ${TUNE_TIMEOUT:-540} python -c "from opgen.cli import app; app()" tune specs/$s.toml -j 16 $TUNE_ARGS > ${OUT:-.}/tune-$s.log 2>&1
    echo "rc=$?" >> $L
    grep -E "fastest|wrong|failed|candidate|compile \(|wrote|Error| ms( |$)" ${OUT:-.}/tune-$s.log >> $L
    cp specs/$s.toml ${OUT:-.}/$s.toml
  done
elif [ "$what" = tests ]; then
  # generated/NAME, or tests/golden/NAME (a golden tree, copied beside the packages to import)
  pkgs=$(for p in "$@"; do
    if [ -d tests/golden/$p ] && [ ! -d generated/$p ]; then cp -r tests/golden/$p generated/$p; fi
    echo generated/$p; done)
  # Every kernel variant built once into TileLang's cache first (16 processes), then loaded by the
  # test workers. PREBUILD=0 skips it.
  [ "${PREBUILD:-1}" = 1 ] && prebuild "$@"
  timeout ${TESTS_TIMEOUT:-320} python -m pytest $pkgs -n ${TESTS_WORKERS:-15} -q -p no:cacheprovider -p no:benchmark -rf > /tmp/tests.log 2>&1
  echo "pytest rc=$? at $(( $(date +%s) - start )) s" >> $L
  grep -E "passed|failed|FAILED|ERROR" /tmp/tests.log | tail -40 >> $L
  gzip -c /tmp/tests.log > ${OUT:-.}/next_gpu_run-pytest.log.gz
elif [ "$what" = bench ]; then
  # PREBUILD=1 for a bench call that no tests call of the same packages came before.
  [ "${PREBUILD:-0}" = 1 ] && prebuild "$@"
  for p in "$@"; do
    # BENCH_BUDGET: no bench starts past that many seconds of the call (the rest are left out).
    if [ $(( $(date +%s) - start )) -gt ${BENCH_BUDGET:-100000} ]; then echo "bench $p left out" >> $L; continue; fi
    timeout ${BENCH_TIMEOUT:-150} python -m generated.$p.bench_$p --json ${OUT:-.}/bench-$p.json >> $L 2>&1
    echo "bench $p rc=$? at $(( $(date +%s) - start )) s" >> $L
  done
elif [ "$what" = source ]; then
  # args: package and mask; the backward kernel's warp stall samples per SASS instruction
  timeout 200 ncu --clock-control none -k regex:"${NCU_KERNELS:-^bwd_kernel}" --launch-skip 3 --launch-count 1 \
    --import-source yes --section SourceCounters --section WarpStateStats -o ${OUT:-.}/source-$1-$2 -f \
    python docs/profiling/ncu_attention.py $1 $2 > ${OUT:-.}/source-$1-$2.txt 2>&1
  ncu -i ${OUT:-.}/source-$1-$2.ncu-rep --page source --csv --print-source sass > ${OUT:-.}/source-$1-$2-sass.csv 2>&1
  echo "source $1 $2 rc=$? at $(( $(date +%s) - start )) s" >> $L
  gzip -f ${OUT:-.}/source-$1-$2-sass.csv
elif [ "$what" = ncu ]; then
  # args: pairs of package and mask, e.g. attention full gqa causal
  while [ $# -gt 1 ]; do
    timeout 150 ncu --clock-control none -k regex:"${NCU_KERNELS:-^(fwd|bwd)_kernel}" --launch-skip 6 --launch-count 2 \
      --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats \
      --section ComputeWorkloadAnalysis --section SchedulerStats --section MemoryWorkloadAnalysis \
      python docs/profiling/ncu_attention.py $1 $2 > ${OUT:-.}/ncu-$1-$2.txt 2>&1
    echo "ncu $1 $2 rc=$? at $(( $(date +%s) - start )) s" >> $L
    shift 2
  done
fi
echo "end at $(( $(date +%s) - start )) s" >> $L
