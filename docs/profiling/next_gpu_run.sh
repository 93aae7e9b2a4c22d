#!/bin/bash
# The GPU work session 22 left, one call each (the device allows 600 s per call; a machine's
# start takes 1-3 of the session's 30 minutes and refused starts count too; it is given back
# 30 s after a call ends, so have the next call ready; carry .gpu, built with
# `../shared/tools/gpu-bundle flash-linear-attention==0.6.0 fla-core==0.6.0`, and .prof).
#   1. O staged by TMA in the paired and several-heads forwards too (session 22, after run 101,
#      which measured it in the unpaired forward: CPU compile check only). Here first: `bash
#      docs/profiling/next_gpu_run.sh baseline 5dd8f62` (generated/attention_registers, the
#      template before). On the GPU, one call: `python docs/profiling/stage_o_probe.py` (outputs
#      bit-identical, then staged / registers; the causal S1000-S2048 cases run the paired
#      forward), then TESTS_TIMEOUT=450 bash docs/profiling/next_gpu_run.sh tests attention
#      attention_sink gqa attention_recompute attention_tuned (gqa, attention_recompute and
#      attention_tuned have not run since the backward grid change either). If it loses or
#      fails, `git revert 49b71b0 87898f2` (the paired and several-heads forwards' staging).
#   2. bench attention gqa attention_sink through the public function.
#   3. Backward variants: `timeout 500 python docs/profiling/bwd_variants_probe.py`: dQ atomics by
#      pairs (the accumulator laid out so TileLang vectorizes them to one 8-byte add per pair,
#      half the RED instructions), the overlapped backward (bwd_schedules.py: async WGMMA, +3-5%
#      in runs 36 and 42 but dK wrong at GQA S333; session 22 found why in its CUDA, a pipeline
#      stage released before the async GEMM reading it was waited for, and fixed it), and both.
#      Correctness at odd lengths first (MHA, GQA in_block, sinks + window), then the backward
#      through run_backward at 8 bench shapes. A variant that is right and faster goes into
#      templates/attention/kernels.py.jinja (pairs: its pairs_layout replaces `_dq_layout`).
#   4. Where the backward's issue slots go (IPC 1.22 vs cuDNN's 1.47 at D128 full, run 98; a third
#      of the stalls on global results, yet the L2 misses were not it, run 99): `bash
#      docs/profiling/next_gpu_run.sh source attention full` (the stall samples per SASS line of
#      the bwd kernel), then here `python docs/profiling/sass_stalls.py source-attention-full-sass.csv.gz`.
#   5. rmsnorm's and scaled_silu's benches (GB/s through the public function at the issue's
#      shapes, and the host rows, last measured in run 50, before the no-grad route): `bash
#      docs/profiling/next_gpu_run.sh bench rmsnorm scaled_silu`.
#   6. rmsnorm's backward with its rows pipelined (docs/profiling/rmsnorm_bwd_pipelined.py: row
#      s + 1 copied into shared memory while row s is reduced; a warp-specialized TMA build and a
#      cp.async build; the shipped one is latency-bound at 62-73% of copy): `timeout 300 python
#      docs/profiling/rmsnorm_bwd_pipelined_probe.py` (24 kernels compile for sm_90a here).
# The two-GPU tests need the nvidia-h200-x2 machine: python -m pytest tests/test_two_gpus.py -v
cd "$(dirname "$0")/../.."
what=$1; shift
if [ "$what" = baseline ]; then
  # On the CPU machine: generated/attention_registers, the attention package rendered from the
  # template of commit $1 (stage_o_probe's baseline); untracked, so it travels to the GPU machine.
  cp templates/attention/kernels.py.jinja /tmp/kernels.py.jinja.now
  git show "$1:templates/attention/kernels.py.jinja" > templates/attention/kernels.py.jinja
  sed 's/^name = "attention"/name = "attention_registers"/' specs/attention.toml > /tmp/attention_registers.toml
  opgen build --no-compile --force /tmp/attention_registers.toml
  cp /tmp/kernels.py.jinja.now templates/attention/kernels.py.jinja
  exit 0
fi
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
