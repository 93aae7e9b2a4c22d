#!/bin/bash
# The GPU work session 20 left, one call each (the device allows 600 s per call; a machine's
# start takes 1-3 of the session's 30 minutes and refused starts count too; it is given back
# 30 s after a call ends, so have the next call ready; carry .gpu, built with
# `../shared/tools/gpu-bundle flash-linear-attention==0.6.0 fla-core==0.6.0`, and .prof).
#   1. bash docs/profiling/next_gpu_run.sh tests attention attention_sink attention_recompute
#      (~250 s): the attention packages with EAGER_APPLY (the eager path calling the C++ apply of
#      its autograd.Function; run 89 passed gqa and the five other packages on it) and the
#      forward's explicit 160/24 register split of three consumer warpgroups (the same CUDA as
#      TileLang's own choice, checked on the CPU).
#   2. Host rows with a warm TileLang cache: python docs/profiling/lean_eager_check.py twice in one
#      call (the first builds the kernels; run 89's rows came right after the builds), and
#      `python -m generated.rmsnorm.bench_rmsnorm --overhead` (and matmul, swiglu, gqa): is the
#      ~2-4 us EAGER_APPLY saves a call visible against eager / addmm / SDPA?
#   3. `opgen tune specs/attention_sink.toml --phases fwd --head-dims 64` is not needed (causal
#      only: 192 query rows lose with a causal mask, run 86); the D64 causal forward (0.77-0.81x
#      cuDNN kernels alone) is the worst forward gap left: ncu of it next to cuDNN's
#      (`DIM=64 bash docs/profiling/next_gpu_run.sh ncu attention causal`, and the same with
#      SDPA=cudnn NCU_KERNELS="cudnn|sm90" for cuDNN's kernels).
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
    grep -E "fastest|wrong|failed|candidate|compile \(|wrote|Error| ms( |$)" ${OUT:-.}/tune-$s.log >> $L
    cp specs/$s.toml ${OUT:-.}/$s.toml
  done
elif [ "$what" = tests ]; then
  # generated/NAME, or tests/golden/NAME (a golden tree, copied beside the packages to import)
  pkgs=$(for p in "$@"; do
    if [ -d tests/golden/$p ] && [ ! -d generated/$p ]; then cp -r tests/golden/$p generated/$p; fi
    echo generated/$p; done)
  timeout ${TESTS_TIMEOUT:-320} python -m pytest $pkgs -n ${TESTS_WORKERS:-15} -q -p no:cacheprovider -p no:benchmark -rf > /tmp/tests.log 2>&1
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
    timeout 150 ncu --clock-control none -k regex:"${NCU_KERNELS:-^(fwd|bwd)_kernel}" --launch-skip 6 --launch-count 2 \
      --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats \
      --section ComputeWorkloadAnalysis --section SchedulerStats --section MemoryWorkloadAnalysis \
      python docs/profiling/ncu_attention.py $1 $2 > ${OUT:-.}/ncu-$1-$2.txt 2>&1
    echo "ncu $1 $2 rc=$? at $(( $(date +%s) - start )) s" >> $L
    shift 2
  done
fi
echo "end at $(( $(date +%s) - start )) s" >> $L
