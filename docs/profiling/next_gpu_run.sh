#!/bin/bash
# The GPU work session 10 left, one call each (the device allows 600 s per call; a machine's
# start takes 1.5-2 of the session's 30 minutes):
#   1. A lean eager autograd path for rmsnorm (run 47: a Function that looks both kernels up in
#      the forward and only allocates, zeroes, launches and casts in the backward does fwd+bwd in
#      163 us vs the package's 304-330 and eager's 145-155). After that template change (and the
#      same structure in the other families' EagerFunction), the packages' tests and overhead rows:
#        bash docs/profiling/next_gpu_run.sh tests rmsnorm scaled_silu matmul ...
#        python docs/profiling/rmsnorm_host_probe.py > $OUT/host.log 2>&1
#   2. The bwd of gqa / attention_sink at head_dim 64 was tuned at 16/16 heads (session 9): re-tune
#      the backward at the grouped default shape, ~2 min each:
#        TUNE_ARGS="--phases bwd" bash docs/profiling/next_gpu_run.sh tune gqa attention_sink
#      (TUNE_ARGS passes options to `opgen tune`; TUNE_TIMEOUT caps each spec, default 540 s.)
#      The GPU machine lacks typer and rich: first, on this machine, `bash
#      docs/profiling/next_gpu_run.sh prep` copies them (and what they import) into .prof/site;
#      carry .prof. On the GPU this script puts it on PYTHONPATH and links opgen/templates to
#      templates/ (what `pip install -e .` maps).
#   3. After `opgen build` of what changed: the tests, then (second call) the benches:
#        bash docs/profiling/next_gpu_run.sh tests attention gqa attention_sink attention_tuned
#        bash docs/profiling/next_gpu_run.sh bench attention gqa attention_sink rmsnorm
#      (ncu of the kernels: bash docs/profiling/next_gpu_run.sh ncu attention full gqa causal;
#      the gpt-oss shape's backward, 1.36x FlexAttention, is not profiled yet.)
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
