#!/bin/bash
# Probe copies of packages rendered from the templates with patches applied (on the CPU machine;
# the copies are untracked and travel to the GPU machine with the tree; never commit them):
#     bash docs/profiling/render_copies.sh PATCH[,PATCH...] SUFFIX PKG...
#     bash docs/profiling/render_copies.sh COMMIT SUFFIX PKG...
#     SPEC_EDIT=SED_EXPRESSION bash docs/profiling/render_copies.sh - SUFFIX PKG...
# renders generated/PKG_SUFFIX from specs/PKG.toml (renamed; SPEC_EDIT, a sed expression, edits
# the copy's spec too) with the patches applied to the templates (or with the templates as
# COMMIT had them: the patch from here to there, opgen/ staying this tree's; - for none), then
# takes them back out. No compile check here: the GPU run compiles the copies. stage_o_probe.py's
# baseline, for one: `bash docs/profiling/render_copies.sh 5dd8f62 registers attention`.
# Session 37's backward probes (patches since landed, run 162) were copies such as
#     bash docs/profiling/render_copies.sh docs/profiling/patches/bwd-full-rotated.patch rot attention gqa
# and session 38's window-1024 backward walking down a spec edit:
#     SPEC_EDIT='/^max_window = 1024/,/^bwd/s/^\(bwd = .*\) }$/\1, descending = true }/' \
#       bash docs/profiling/render_copies.sh - desc attention_sink
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ "$1" = - ]; then
  patches=()
elif [ ! -f "${1%%,*}" ] && git rev-parse -q --verify "$1^{commit}" > /dev/null; then
  git diff HEAD "$1" -- templates/ > /tmp/render_copies_$2.patch
  patches=(/tmp/render_copies_$2.patch)
else
  IFS=, read -r -a patches <<< "$1"
fi
suffix=$2; shift 2
applied=()
# A patch's tests are left out: the copies need only what renders them, and a test file that has
# moved on since the patch was written would stop it applying.
undo() { for ((i=${#applied[@]}-1; i>=0; i--)); do git apply -R --exclude='tests/*' "${applied[i]}"; done; }
trap undo EXIT
for patch in "${patches[@]}"; do
  [ -s "$patch" ] || continue  # COMMIT's templates are these
  git apply --exclude='tests/*' "$patch"
  applied+=("$patch")
done
specs=()
for p in "$@"; do
  sed -e "s/^name = \"$p\"/name = \"${p}_$suffix\"/" -e "${SPEC_EDIT:-}" specs/$p.toml > /tmp/${p}_$suffix.toml
  specs+=(/tmp/${p}_$suffix.toml)
done
opgen build --no-compile --force "${specs[@]}"
