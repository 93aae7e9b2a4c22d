#!/bin/bash
# The GPU work session 19 left, one call each (the device allows 600 s per call; a machine's
# start takes 1-3 of the session's 30 minutes and refused starts count too; carry .gpu, built with
# `../shared/tools/gpu-bundle flash-linear-attention==0.6.0 fla-core==0.6.0`, and .prof).
#   1. bash docs/profiling/next_gpu_run.sh tests gqa attention attention_sink attention_recompute
#      (~300 s): the attention packages with the inputs checked once per metadata
#      (check_new_inputs) and the launch rules moved to opgen/families/attention_launch.py; the
#      other five packages passed with it (run 83).
#   2. Wider key blocks in the forward: python docs/profiling/fwd_schedule_probe.py with
#      CONFIGS="overlap 128x128 s2,overlap 128x176 s2,loop 128x176 s2,overlap 128x160 s2,loop 128x192 s1"
#      (correctness at odd lengths first, then the six bench shapes against cuDNN). TileLang
#      gives each consumer warpgroup 240 registers (warpgroup_reg_alloc<240> in the lowered
#      forward), so a 64 x 176 score tile per warpgroup may fit; the spec's power-of-two rule
#      for block_n would need to allow multiples of 16 if one wins. Then the D64 cases
#      (CASES="8,16,16,2048,64,0,float16;8,16,16,2048,64,1,float16") with
#      CONFIGS="overlap 128x128 s2,overlap 192x128 t384 s2,loop 192x128 t384 s2,loop 192x192 t384 s2":
#      three consumer warpgroups of 64 rows (they compile on the CPU at D64: 90-123 KB).
#   3. python docs/profiling/attention_host_ladder.py (~1 min): where gqa's forward host time
#      goes, at B1 S128 and at the model's B2 16/4 S1024, where the paired kernel alone runs at
#      309 TF/s and the public function at 147-173 (run 80): the short causal forward through
#      the public function is host-bound. (matmul's, 1.78x addmm in run 83, is bound by Python's
#      autograd.Function: a no-launch Function costs 12-19 us.)
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
  timeout 320 python -m pytest $pkgs -n 15 -q -p no:cacheprovider -p no:benchmark -rf > /tmp/tests.log 2>&1
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
