#!/bin/bash
# The GPU work session 18 left, one call each (the device allows 600 s per call; a machine's
# start takes 1-3 of the session's 30 minutes and refused starts count too; carry .gpu, built with
# `../shared/tools/gpu-bundle flash-linear-attention==0.6.0 fla-core==0.6.0`, and .prof).
#   1. Branch causal-pairs (the causal forward pairs query blocks i and n - 1 - i at <= 16 query
#      blocks; +37% at S1000 kernel alone, run 76): git checkout causal-pairs (git merge main
#      first if main moved); python docs/profiling/short_causal_probe.py twice, and
#      CASES="2,16,4,1024,128,1,bfloat16;2,32,8,1000,128,1,bfloat16" CONFIGS="overlap 128x128 s2,pairs loop 128x128 s2"
#      python docs/profiling/fwd_schedule_probe.py: does the paired kernel lose at B2 16/4 S1024
#      (run 79: 77 vs 144 TF/s through the public function) or was that the host?
#   2. If it holds: bash docs/profiling/next_gpu_run.sh tests gqa attention attention_sink attention_recompute
#      (the packages' kernel_key now tells the paired and overlapped kernels apart, so the causal
#      tests run the paired one for real); merge to main if they pass.
#   3. matmul's host forward is 1.76x addmm (run 75): torch.profiler of one call at 64^3.
#   4. in_block vs split at small causal grids (B8 16/2 S2048 D64: 0.85x, run 57).
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
