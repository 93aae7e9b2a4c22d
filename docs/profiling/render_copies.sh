#!/bin/bash
# Probe copies of packages rendered from the templates with a patch applied (on the CPU machine;
# the copies are untracked and travel to the GPU machine with the tree; never commit them):
#     bash docs/profiling/render_copies.sh PATCH SUFFIX PKG...
# renders generated/PKG_SUFFIX from specs/PKG.toml (renamed) with PATCH applied to templates/,
# then takes the patch back out. No compile check here: the GPU run's prebuild compiles them.
# Example (session 37's causal backward walking its query blocks from the last one down):
#     bash docs/profiling/render_copies.sh docs/profiling/patches/bwd-causal-descending.patch rev \
#       attention gqa attention_sink
#   then on the GPU: `MASK=causal bash docs/profiling/rows_ab.sh attention attention_rev gqa
#   gqa_rev attention_sink attention_sink_rev` and `bash docs/profiling/next_gpu_run.sh tests
#   attention_rev gqa_rev attention_sink_rev`.
set -euo pipefail
cd "$(dirname "$0")/../.."
patch=$1 suffix=$2; shift 2
git apply --check "$patch"
git apply "$patch"
trap 'git apply -R "$patch"' EXIT
specs=()
for p in "$@"; do
  sed "s/^name = \"$p\"/name = \"${p}_$suffix\"/" specs/$p.toml > /tmp/${p}_$suffix.toml
  specs+=(/tmp/${p}_$suffix.toml)
done
opgen build --no-compile --force "${specs[@]}"
