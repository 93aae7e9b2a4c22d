#!/bin/bash
# The GPU work session 21 left, one call each (the device allows 600 s per call; a machine's
# start takes 1-3 of the session's 30 minutes and refused starts count too; it is given back
# 30 s after a call ends, so have the next call ready; carry .gpu, built with
# `../shared/tools/gpu-bundle flash-linear-attention==0.6.0 fla-core==0.6.0`, and .prof).
#   1. The persistent forward prototype (docs/profiling/persistent_fwd.py: one block per SM walks
#      its tiles longest first, hand-written producer/consumer warpgroups with mbarriers, the
#      next tile's Q and K/V loading during this tile's epilogue; lowered and compiled for sm_90a
#      on the CPU, never run): `timeout 540 python
#      docs/profiling/persistent_fwd_probe.py` -- correctness at odd lengths against the
#      package's forward, then TF/s next to it and cuDNN at D64/D128, causal and full, and next
#      to attention_sink's forward with sinks, sinks + window 1024 and the gpt-oss shape (64/8
#      heads, D64, window 128). A hang exits 3 naming the case. D64 causal (0.72-0.79x cuDNN)
#      and the short window (1-2 key blocks a tile) are the cases it is for.
#   2. Every package's tests: the eager path now runs EagerFunction.forward alone where no input
#      needs a gradient (NO_GRAD; new generated test test_forward_without_gradients_is_the_
#      training_forward; CPU-tested on empty work only). A fresh machine builds every kernel:
#      TESTS_TIMEOUT=540 bash docs/profiling/next_gpu_run.sh tests attention gqa attention_sink
#      attention_recompute, then (warm) tests matmul rmsnorm swiglu scaled_silu linear_attention
#      swiglu_fused attention_tuned.
#   3. bench attention: the D128 causal forward re-tuned to overlap 128x128 s2 (run 94) through
#      the public function (the same kernel as gqa's, whose tests pass); and the no-grad host
#      rows: `python -m generated.matmul.bench_matmul --overhead` under torch.no_grad vs addmm
#      (~3 us a call saved on this CPU).
#   4. Host rows stay too noisy to rank 2-4 us changes (runs 89-92): measure them only next to
#      their baselines in one process, several rounds (python docs/profiling/lean_eager_check.py
#      now has an eval fwd column: the no-grad route).
#   5. The D128 backward (0.82-0.88x cuDNN) next to cuDNN's persistent bprop in ncu, as run 92
#      did for D64: `bash docs/profiling/next_gpu_run.sh ncu attention full` and the same with
#      SDPA=cudnn NCU_KERNELS="cudnn|sm90" (rename ncu-attention-full.txt between the two).
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
