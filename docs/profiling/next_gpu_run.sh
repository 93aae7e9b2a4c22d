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
# and two-stage sinks backward dropped). Left, in this order:
#   1. The window-1024 backward (1.31x FlexAttention on the H200, the target 1.5x). Not its memory
#      traffic: the heads-outer walk (run 202) raised the L2 hit rate 59.5% -> 79.7% and cut DRAM
#      2.5x, and was 15% slower. One block an SM (168 registers, shared memory); SM throughput 44%.
#      Next: its source-level stalls (`WINDOW=1024 bash docs/profiling/next_gpu_run.sh source
#      attention_sink causal`) against the sinks causal backward's (the same call without
#      WINDOW; both write source-attention_sink-causal*: move the first aside): per step, what
#      the window's 4 masked steps in ~18 cost against the causal walk's 2 in ~32, and the
#      block's fixed cost over 4 heads x 18 steps. (Its tiling is opgen tune's pick over its
#      search space, H100 2026-12-06.)
#   2. The D128 backward (H200 runs 201 / 204: 0.85x / 0.84x cuDNN full, 0.87x / 0.91x causal;
#      D64 full 0.88x / 0.85x; GQA causal 0.89x): the ping-pong backward's source-level profile
#      (run 178: right, level to 10% slower): `bash docs/profiling/render_copies.sh
#      docs/profiling/patches/bwd-pingpong.patch bpp attention`, then `bash
#      docs/profiling/next_gpu_run.sh source attention_bpp full` against run 159's
#      (docs/gpu-logs/run159-source-attention-full-sass-h100.csv.gz): whether the turns wait on
#      each other or the partial dQ hand-off is what it loses. (Dropped: the cluster backward,
#      run 183, 5-26% slower; each warpgroup overlapping its own GEMMs, run 113, at most 1.4%.)
#   3. The sinks causal backward (1.40x FlexAttention on the H200, run 201; two stages no faster):
#      profile after 1.
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
