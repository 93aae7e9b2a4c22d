#!/bin/bash
# The forward launch-order A/B of run 150 in one GPU call: the copies that
# fwd_grid_probe.py writes beside attention and gqa, their opgen rows only (opgen_rows.py), every
# package first run at once to compile its kernels (those timings thrown away), then two timed
# rounds in turn. Log: $OUT/fwd_ab.log.
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PYTHONPATH:$(pwd)/.prof/site"
python -c "import opgen.templates" 2>/dev/null || ln -s ../templates opgen/templates
export TILELANG_DEFAULT_TARGET='{"kind": "cuda", "arch": "sm_90a"}'
L=${OUT:-.}/fwd_ab.log
start=$(date +%s)
runs="attention:attention attention_fwd_heads_fastest:attention attention_fwd_heads_by_8:attention
      gqa:gqa gqa_fwd_heads_fastest:gqa gqa_fwd_heads_by_8:gqa"
for r in $runs; do
  timeout 300 python docs/profiling/opgen_rows.py generated.${r%:*}.bench_${r#*:} ${MASK:-causal} > /dev/null 2>&1 &
done
wait
echo "compiled at $(( $(date +%s) - start )) s" >> $L
for round in 1 2; do
  for r in $runs; do
    timeout 60 python docs/profiling/opgen_rows.py generated.${r%:*}.bench_${r#*:} ${MASK:-causal} 2>&1 \
      | grep -E "^## |opgen" >> $L
  done
done
echo "end at $(( $(date +%s) - start )) s" >> $L
