#!/bin/bash
# The GPU run that session 7 left (its device time ran out after runs 26-30): every generated
# test on the final tree, which includes the copy-once tests of rmsnorm, scaled_silu, matmul and
# linear_attention (test_strided_inputs_are_copied_once) that have not run yet. Run from the
# repository root on the H200 with the bundle:
#   source .gpu/env.sh && bash docs/profiling/next_gpu_run.sh      (one log under $OUT, ~6 min)
# Then record it in docs/gpu-runs.md. Next, in calls of their own (issue 11):
#   opgen tune specs/attention.toml --phases fwd -j 16;  opgen tune specs/attention.toml --phases bwd -j 16
# The two-GPU tests need the nvidia-h200-x2 machine: python -m pytest tests/test_two_gpus.py -v
# (NCCL_NVLS_ENABLE=0 is set by the test itself).
cd "$(dirname "$0")/../.."
L=${OUT:-.}/next_gpu_run.log
W=/tmp/next-gpu; mkdir -p $W
start=$(date +%s)
sec() { echo; echo "=== [$(( $(date +%s) - start )) s] $*" >> $L; }
# Every generated test, golden packages included.
cp -r tests/golden/attention_recompute tests/golden/swiglu_fused tests/golden/attention_tuned generated/
sec "tests"
timeout 330 python -m pytest generated -n 15 -q -p no:cacheprovider -p no:benchmark -rf > $W/tests.log 2>&1
echo "pytest rc=$?" >> $L
grep -E "passed|failed|FAILED|ERROR" $W/tests.log | tail -40 >> $L
rm -rf generated/attention_recompute generated/swiglu_fused generated/attention_tuned
sec "end"
gzip -c $W/tests.log > ${OUT:-.}/next_gpu_run-pytest.log.gz
