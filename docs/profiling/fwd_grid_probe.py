"""A copy of an attention package whose forward grid runs heads fastest, for an A/B against the
package itself (next_gpu_run.sh's list, item 1). On the CPU machine:

    python docs/profiling/fwd_grid_probe.py attention   # writes generated/attention_fwd_heads_fastest

then on the GPU machine, in one call, the benches alternated (compare the causal rows):

    for p in attention attention_fwd_heads_fastest attention attention_fwd_heads_fastest; do
        python -m generated.$p.bench_attention; done

The copy swaps the main forward kernel's first two grid dims (query blocks, heads), so that with
the longest query blocks first within a head (query_block) the whole launch runs longest first;
its full (non-causal) rows change order too. Untracked: delete it before a commit.
"""

import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
QUERY_BLOCKS_FASTEST = """        with T.Kernel(T.ceildiv(seq_len, block_m), heads, batch, threads=threads) as (
            launch_x,
            by,
            bz,
        ):"""
HEADS_FASTEST = """        with T.Kernel(heads, T.ceildiv(seq_len, block_m), batch, threads=threads) as (
            by,
            launch_x,
            bz,
        ):"""

if __name__ == "__main__":
    name = sys.argv[1]
    source, copy = ROOT / "generated" / name, ROOT / "generated" / f"{name}_fwd_heads_fastest"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(source, copy)
    kernels = copy / "kernels.py"
    text = kernels.read_text()
    assert text.count(QUERY_BLOCKS_FASTEST) == 1, "the forward's grid is not where this probe expects it"
    kernels.write_text(text.replace(QUERY_BLOCKS_FASTEST, HEADS_FASTEST))
    print(f"wrote {copy.relative_to(ROOT)}")
