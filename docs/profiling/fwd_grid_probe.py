"""A copy of an attention package whose forward grid runs heads fastest, for an A/B against the
package itself. Run 150 measured it on packages as 60f1aef rendered them (query blocks fastest):
heads fastest was never slower and 7-13% faster at D64, and the template has since launched
causal forwards heads fastest (attention_launch.launch_grid), so on packages rendered now this
probe stops at its assertion; render one from 60f1aef's template to repeat it. On the CPU
machine:

    python docs/profiling/fwd_grid_probe.py attention     # generated/attention_fwd_heads_fastest
    python docs/profiling/fwd_grid_probe.py attention 8   # generated/attention_fwd_heads_by_8

then on the GPU machine, in one call, the benches alternated (compare the causal rows):

    for p in attention attention_fwd_heads_fastest attention_fwd_heads_by_8 attention \
        attention_fwd_heads_fastest attention_fwd_heads_by_8; do python -m generated.$p.bench_attention; done

heads_fastest swaps the main forward kernel's first two grid dims (query blocks, heads), so that
with the longest query blocks first within a head (query_block) the whole launch runs longest
first, but the blocks running at once span every head (each streams its own K/V). heads_by_N
launches N heads at a time, longest first within them: the blocks running at once share N heads'
K/V, and the model (launch_order_model.py's, with chunks) still puts the makespan at the ideal
where N heads' blocks fill the GPU's block slots (N = 4-8 at 32 query blocks and 132 slots; 16 at
528 slots, four blocks an SM). Full (non-causal) rows change order too. Untracked: delete the
copies before a commit.
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
# N heads at a time (N divides heads): grid x runs the chunk's heads fastest, then its query
# blocks (longest first, as query_block maps them); grid y the chunks.
HEADS_BY_N = """        with T.Kernel(T.ceildiv(seq_len, block_m) * {n}, heads // {n}, batch, threads=threads) as (
            launch,
            chunk,
            bz,
        ):
            by = chunk * {n} + launch % {n}
            launch_x = launch // {n}"""
HEADS_FASTEST = """        with T.Kernel(heads, T.ceildiv(seq_len, block_m), batch, threads=threads) as (
            by,
            launch_x,
            bz,
        ):"""

if __name__ == "__main__":
    name, n = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else None
    variant = f"heads_by_{n}" if n else "heads_fastest"
    source, copy = ROOT / "generated" / name, ROOT / "generated" / f"{name}_fwd_{variant}"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(source, copy)
    kernels = copy / "kernels.py"
    text = kernels.read_text()
    assert text.count(QUERY_BLOCKS_FASTEST) == 1, "the forward's grid is not where this probe expects it"
    grid = HEADS_BY_N.format(n=n) if n else HEADS_FASTEST
    kernels.write_text(text.replace(QUERY_BLOCKS_FASTEST, grid))
    print(f"wrote {copy.relative_to(ROOT)}")
