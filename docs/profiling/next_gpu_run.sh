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
# tested, benched), then no start. Left, in this order:
#   0. The causal backward launching a few heads at a time (key blocks longest first within
#      them) instead of every head of a batch: docs/profiling/walk_order_model.py (an LRU replay
#      of the steps' q, dO and dQ tiles, which ranks run 162's and 164's walk results as
#      measured) puts the MHA causal backward's traffic at up to 2.2x its floor with the
#      shipped order and at the floor with 4 or 8 heads at a time (both at the ideal makespan),
#      depending on how much of the L2 the tiles really get; key blocks fastest (1 at a time)
#      costs 6-28% makespan (GQA worst), so that patch was dropped. On the CPU machine
#      `P=docs/profiling/patches/bwd-heads-at-once.patch; bash docs/profiling/render_copies.sh
#      $P h4 attention gqa attention_sink; bash docs/profiling/render_copies.sh $P h8 attention;
#      sed -i 's/^BWD_HEADS_AT_ONCE = 4$/BWD_HEADS_AT_ONCE = 8/' generated/attention_h8/kernels.py`
#      (their kernels lower on the CPU), then one call: `MASK=causal bash
#      docs/profiling/rows_ab.sh attention attention_h4 attention_h8 gqa gqa_h4 attention_sink
#      attention_sink_h4` (~350 s). What wins becomes a bwd tiling field (heads at once, per
#      entry) with its tests, as descending did.
#   1. Why the window-1024 backward (1.04x FlexAttention) is 1.34x slower walking down (run 164)
#      when the causal one is 15% faster: the two at ncu. On the CPU machine
#      `SPEC_EDIT='/^max_window = 1024/,/^bwd/s/^\(bwd = .*\) }$/\1, descending = true }/' bash
#      docs/profiling/render_copies.sh - desc attention_sink` (that entry walking down), then one call:
#      `export PYTHONPATH=$PYTHONPATH:$(pwd)/.prof/site TILELANG_DEFAULT_TARGET='{"kind": "cuda",
#      "arch": "sm_90a"}'; for p in attention_sink attention_sink_desc; do WINDOW=1024 python
#      docs/profiling/ncu_attention.py $p & done; wait; WINDOW=1024 bash
#      docs/profiling/next_gpu_run.sh ncu attention_sink causal attention_sink_desc causal`
#      (the first loop fills TileLang's cache; compare L2 hit rate, DRAM bytes, stalls).
#   2. On the H200 (an H100 came in every call of sessions 35-38): `PREBUILD=1 bash
#      docs/profiling/next_gpu_run.sh bench attention attention_sink gqa`.
#   3. `opgen tune --phases bwd` of the causal entries not yet timed walking down (attention D64
#      and D128 were level or slower in run 162; gqa D64, attention_sink D64 untimed), one call
#      each (a causal entry's bwd space is 58-70 candidates since descending joined it):
#      `TUNE_ARGS="--phases bwd --head-dims 64 --windows 0" bash docs/profiling/next_gpu_run.sh
#      tune gqa` (then attention_sink).
#   4. The D128 backward (0.82x cuDNN full, GQA 0.89x on an H100): what keeps two consumer
#      warpgroups from overlapping each other's GEMM waits (run 159's stall profile).
#      The causal D128 forward (0.81-0.89x): where its per-block fixed cost goes,
#      `NCU_KERNELS=^fwd_kernel bash docs/profiling/next_gpu_run.sh source attention causal`
#      (10 s; run 154 has its ncu).
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
export PYTHONPATH="$PYTHONPATH:$(pwd)/.prof/site"
python -c "import opgen.templates" 2>/dev/null || ln -s ../templates opgen/templates
L=${OUT:-.}/next_gpu_run.log
start=$(date +%s)
# One target for every mode's kernels: TileLang's cache key holds it, so the kernels prebuild
# (below), the tests, the benches and opgen tune build are loaded by the others.
export TILELANG_DEFAULT_TARGET='{"kind": "cuda", "arch": "sm_90a"}'
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
    timeout 150 python -m generated.$p.bench_$p --json ${OUT:-.}/bench-$p.json >> $L 2>&1
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
