#!/bin/bash
# The GPU work session 11 left, one call each (the device allows 600 s per call; a machine's
# start takes 1.5-2 of the session's 30 minutes):
#   1. The CallPlan eager path (templates/_base/autograd_rowwise.py.jinja, run 50: rmsnorm fwd 26.7
#      us, fwd+bwd 175; scaled_silu within 1.5x eager) carried to swiglu, matmul and the attention
#      template (gqa's backward makes 7-8 launches), then:
#        bash docs/profiling/next_gpu_run.sh tests swiglu matmul attention gqa attention_sink
#        python -m generated.<p>.bench_<p> --overhead   (each package)
#        python docs/profiling/eager_ladder_probe.py    (rmsnorm's ladder down to the leanest Function)
#   2. attention_sink's backward at head_dim 64 at the grouped shape (gqa's was re-tuned in run 48
#      and its tables stand). Tune only what is needed: the whole bwd tune of one spec takes over
#      4 minutes, so one spec per call:
#        TUNE_TIMEOUT=540 TUNE_ARGS="--phases bwd" bash docs/profiling/next_gpu_run.sh tune attention_sink
#      (TUNE_ARGS passes options to `opgen tune`; the GPU machine lacks typer and rich: first, on
#      this machine, `bash docs/profiling/next_gpu_run.sh prep` copies them into .prof/site; carry
#      .prof. On the GPU this script puts it on PYTHONPATH and links opgen/templates.)
#   3. Profile the gpt-oss backward (window 128, 1.36x FlexAttention) and the D64 forward:
#        bash docs/profiling/next_gpu_run.sh ncu attention full gqa causal
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
if [ "$what" = tune ]; then
  for s in "$@"; do
    echo "=== [$(( $(date +%s) - start )) s] opgen tune specs/$s.toml -j 16 $TUNE_ARGS" >> $L
    # The whole log straight into $OUT: a call that runs out of time still brings it back.
    timeout ${TUNE_TIMEOUT:-540} python -c "from opgen.cli import app; app()" tune specs/$s.toml -j 16 $TUNE_ARGS > ${OUT:-.}/tune-$s.log 2>&1
    echo "rc=$?" >> $L
    grep -E "fastest|wrong|failed|candidate|wrote|Error| ms$" ${OUT:-.}/tune-$s.log >> $L
    cp specs/$s.toml ${OUT:-.}/$s.toml
  done
elif [ "$what" = tests ]; then
  # generated/NAME, or tests/golden/NAME (a golden tree, copied beside the packages to import)
  pkgs=$(for p in "$@"; do
    if [ -d tests/golden/$p ] && [ ! -d generated/$p ]; then cp -r tests/golden/$p generated/$p; fi
    echo generated/$p; done)
  timeout 400 python -m pytest $pkgs -n 15 -q -p no:cacheprovider -p no:benchmark -rf > /tmp/tests.log 2>&1
  echo "pytest rc=$? at $(( $(date +%s) - start )) s" >> $L
  grep -E "passed|failed|FAILED|ERROR" /tmp/tests.log | tail -40 >> $L
  gzip -c /tmp/tests.log > ${OUT:-.}/next_gpu_run-pytest.log.gz
elif [ "$what" = bench ]; then
  for p in "$@"; do
    timeout 150 python -m generated.$p.bench_$p --json ${OUT:-.}/bench-$p.json >> $L 2>&1
  done
elif [ "$what" = ncu ]; then
  # args: pairs of package and mask, e.g. attention full gqa causal
  while [ $# -gt 1 ]; do
    timeout 150 ncu --clock-control none -k regex:"^(fwd|bwd)_kernel" --launch-skip 6 --launch-count 2 \
      --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats \
      --section ComputeWorkloadAnalysis --section SchedulerStats --section MemoryWorkloadAnalysis \
      python docs/profiling/ncu_attention.py $1 $2 > ${OUT:-.}/ncu-$1-$2.txt 2>&1
    echo "ncu $1 $2 rc=$? at $(( $(date +%s) - start )) s" >> $L
    shift 2
  done
fi
echo "end at $(( $(date +%s) - start )) s" >> $L
