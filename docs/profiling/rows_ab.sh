#!/bin/bash
# An A/B of package copies in one GPU call: their bench's opgen rows only (opgen_rows.py), every
# package first run at once to compile its kernels (those timings thrown away), then two timed
# rounds in turn. Args: packages, each NAME (generated/NAME/bench_NAME.py) or NAME:BENCH (a copy
# that kept its original's bench_BENCH.py, as fwd_grid_probe.py's do). MASK=causal (default),
# full, window (the windowed bench shapes) or all. Log: $OUT/rows_ab.log. Run 150 (the forward's
# launch order):
#   bash docs/profiling/rows_ab.sh attention attention_fwd_heads_fastest:attention \
#     attention_fwd_heads_by_8:attention gqa gqa_fwd_heads_fastest:gqa gqa_fwd_heads_by_8:gqa
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PYTHONPATH:$(pwd)/.prof/site"
python -c "import opgen.templates" 2>/dev/null || ln -s ../templates opgen/templates
export TILELANG_DEFAULT_TARGET='{"kind": "cuda", "arch": "sm_90a"}'
L=${OUT:-.}/rows_ab.log
mask=${MASK:-causal}
[ "$mask" = all ] && mask=
start=$(date +%s)
module() { local p=${1%:*} b=${1#*:}; echo generated.$p.bench_$b; }
for r in "$@"; do
  timeout 300 python docs/profiling/opgen_rows.py $(module $r) $mask > /dev/null 2>&1 &
done
wait
echo "compiled at $(( $(date +%s) - start )) s" >> $L
for round in 1 2; do
  for r in "$@"; do
    timeout 90 python docs/profiling/opgen_rows.py $(module $r) $mask 2>&1 | grep -E "^## |opgen" >> $L
  done
done
echo "end at $(( $(date +%s) - start )) s" >> $L
