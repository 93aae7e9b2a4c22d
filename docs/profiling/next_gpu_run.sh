#!/bin/bash
# The GPU run that session 6 planned and could not make (no device was lent after run 25): what
# the work since run 25 needs shown. Run from the repository root on the H200 with the bundle:
#   source .gpu/env.sh && bash docs/profiling/next_gpu_run.sh      (one log under $OUT, ~9 min)
# Then record it in docs/gpu-runs.md and BENCHMARKS.md. The two-GPU tests need the
# nvidia-h200-x2 machine: python -m pytest tests/test_two_gpus.py -v (NCCL_NVLS_ENABLE=0 is set by
# the test itself).
cd "$(dirname "$0")/../.."
L=${OUT:-.}/next_gpu_run.log
W=/tmp/next-gpu; mkdir -p $W
start=$(date +%s)
sec() { echo; echo "=== [$(( $(date +%s) - start )) s] $*" >> $L; }
# 1. Every generated test, golden packages included: softmax_scale, autocast, the strided-view
#    fix, no materialized aux gradients, the device guard, misaligned inputs, the HF hookup.
cp -r tests/golden/attention_recompute tests/golden/swiglu_fused tests/golden/attention_tuned generated/
sec "tests"
timeout 330 python -m pytest generated -n 15 -q -p no:cacheprovider -p no:benchmark -rf > $W/tests.log 2>&1
echo "pytest rc=$?" >> $L
grep -E "passed|failed|FAILED|ERROR" $W/tests.log | tail -40 >> $L
rm -rf generated/attention_recompute generated/swiglu_fused generated/attention_tuned
# 2. The benches with back-to-back timing (stream_ms): swiglu's bwd against the copy (issue 9).
for p in swiglu rmsnorm scaled_silu; do
  sec "bench $p"
  timeout 70 python -m generated.$p.bench_$p --json ${OUT:-.}/$p.json 2>&1 | grep -v "TileLang:" >> $L
done
# 3. Host time at the tiny shapes, after the materialize and dy cuts (three processes each).
for i in 1 2 3; do for p in rmsnorm matmul attention; do
  sec "overhead $p ($i)"
  timeout 40 python -m generated.$p.bench_$p --overhead 2>&1 | grep -v "TileLang:" | tail -6 >> $L
done; done
# 4. The cold build: each kernel alone and two together on this host (16 cores).
sec "build overlap"
timeout 90 python docs/profiling/build_overlap.py 2>&1 | grep -v "TileLang:" >> $L
sec "end"
gzip -c $W/tests.log > ${OUT:-.}/next_gpu_run-pytest.log.gz
