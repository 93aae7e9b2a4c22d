"""The attention launch rules: the tiling each phase runs at, and the forward kernel (and how many
query heads per block) a call of a given shape gets. The code between the marker lines below is
copied verbatim into every attention package's kernels.py (a package never imports opgen), and
opgen's plan calls the same functions for its compile jobs and the grids `opgen explain` shows:
the rules live here, once.

Behind the constants (H200, kernel alone, D128): pairing causal query blocks gains 37% at 8 query
blocks (S1000) and 7-10% at 16, and loses to the single-block overlapped schedule at 32 and more.
"""

# >>> tuned tilings
def tuned_tiling(tilings, base, head_dim, causal, window):
    """The tiling a call launches a phase with. tilings: the phase's [[tiling.tuned]] entries,
    {(head_dim, causal, max_window): tiling}, max_window 0 where the entry has none. A
    sliding-window call takes the entry of its (head_dim, causal) with the narrowest max_window
    at least its window; any other call, or a window wider than every max_window, the entry
    without one; else the base tiling. Why per window: at a short window each query block sees
    one to three key blocks, and the tiling that is fastest there (smaller blocks, two an SM) is
    slower where a block walks many."""
    fitting = [
        w for d, c, w in tilings if (d, c) == (head_dim, causal) and w and window and window <= w
    ]
    return tilings.get((head_dim, causal, min(fitting, default=0)), base)


# <<<


# >>> dq accumulator
# Rows of a dQ tile that one bulk reduce-add carries (a bwd tiling with bulk_dq).
DQ_TILE = 16


def padded_rows(seq_len):
    """Rows of lse, Delta and the fp32 dQ accumulator: a multiple of DQ_TILE, so that an fp32 row
    is 16-byte aligned for TMA copies, the dQ fragment layout can group rows by 8, and the
    bulk_dq layout holds whole tiles."""
    return (seq_len + DQ_TILE - 1) // DQ_TILE * DQ_TILE


def postprocess_tiling(tiling, bulk_dq):
    """The postprocess's tiling for dQ written by a bwd kernel with (or without) bulk_dq: the
    accumulator's layout is the bwd kernel's, so the postprocess reads it the same way."""
    return {**tiling, "bulk_dq": True} if bulk_dq else tiling


# <<<


# >>> launch order
def launch_grid(causal, blocks, head_blocks):
    """Grid dims x and y (z is the batch) of the forward (blocks: query blocks) and the backward
    (key blocks) kernels. Blocks launch in grid order, x fastest. Causal blocks differ in length
    and each head's come longest first (the forward's query_block launches the last query block
    first; in the backward key block 0, which every query sees, is first), so causal grids run
    heads fastest: every head's longest block launches before any head's next one, and the last
    wave holds the shortest. With blocks fastest a head's longest block launches only after every
    block of the heads before it, and the launch ends with long blocks on a few SMs. Blocks
    fastest against heads fastest: B2, 32 query / 8 KV heads, S4096, D128, causal backward 2.44 ms
    against 1.99 on an H100 (2.08 against 1.77 on an H200); the D64 causal forward at B4 H16
    S4096, four blocks an SM, 0.37-0.39 against 0.34. Full grids run blocks fastest: the blocks
    running at once share a few heads' data in L2 (the backward at B4 H16 S4096 D128: an L2 hit
    rate of 94% against 82%, a third of the DRAM traffic)."""
    return (head_blocks, blocks) if causal else (blocks, head_blocks)


def launch_block(causal, launch_x, launch_y):
    """(block, head or KV head) of the block at grid index (launch_x, launch_y) of launch_grid."""
    return (launch_y, launch_x) if causal else (launch_x, launch_y)


# <<<


# >>> paired causal forward
# Causal forward grids of at most this many query blocks pair them (pairs_query_blocks).
PAIRED_MAX_QUERY_BLOCKS = 16
# The paired kernel holds Q once per stage besides K and V, so its key blocks stay at most this
# many rows whatever the forward's are (at head dim 128 and two stages, 192 would need 288 KB of
# shared memory).
PAIRED_MAX_BLOCK_N = 128


def has_paired_forward(causal, window):
    """Whether a variant builds the paired forward (pairs_query_blocks says which calls run it):
    causal without a window."""
    return bool(causal) and not window


def pairs_query_blocks(causal, window, seq_len, block_m):
    """Whether a forward call runs the paired kernel (pair_blocks=True): causal without a window,
    at most PAIRED_MAX_QUERY_BLOCKS query blocks. Query block i sees i + 1 key blocks; in a short
    grid each block is mostly prologue and epilogue, and blocks of one or two steps leave the
    pipeline empty. Paired, query blocks i and n - 1 - i share one block's pipeline of n + 1 key
    steps: half the blocks, all of one length, the second query block's first tiles loading
    during the first one's epilogue. In longer grids the key loop hides those already, and the
    paired pipeline's Q reload with every key block costs more than it saves."""
    query_blocks = (seq_len + block_m - 1) // block_m
    return has_paired_forward(causal, window) and query_blocks <= PAIRED_MAX_QUERY_BLOCKS


def paired_block_n(block_n):
    """The paired forward's key rows a block, for a forward of block_n ones: at most
    PAIRED_MAX_BLOCK_N."""
    return min(block_n, PAIRED_MAX_BLOCK_N)


def paired_tiling(tiling):
    """The paired forward's tiling: the forward's own, with pair_blocks=True and its block_n
    (paired_block_n). The paired kernel runs the plain schedule, so overlap and pingpong are left
    out (of its cache key too)."""
    paired = {key: value for key, value in tiling.items() if key not in ("overlap", "pingpong")}
    return {**paired, "block_n": paired_block_n(tiling["block_n"]), "pair_blocks": True}


# <<<


# >>> short windows
def walks_heads(window, block_m, block_n):
    """Whether the forward's block walks several query heads: at a window so short that a block
    of queries sees at most two blocks of keys (block_m a multiple of block_n). Such a block is
    mostly prologue (Q and the first K/V loads) and epilogue (O and lse stores): one pipeline over
    several heads' (head, key block) steps loads the next head's tiles during this head's
    epilogue. At longer windows the key loop hides them already, and reloading Q every step
    (what lets heads follow each other in one pipeline) costs more than it saves."""
    key_blocks = block_m // block_n + (window - 1 + block_n - 1) // block_n
    return bool(window) and block_m % block_n == 0 and key_blocks <= 2


# At most this many query heads per forward block: past it the prologue and epilogue are
# already a small part of a block's time.
MAX_HEADS_PER_BLOCK = 8


def heads_per_block(batch, heads, seq_len, tiling, sm_count):
    """Query heads per block of a forward that walks heads (walks_heads), for one call's shape
    and forward tiling: the most, a power of two dividing heads and at most MAX_HEADS_PER_BLOCK,
    that still leave blocks for 7/8 of the GPU's block slots (SMs x the tiling's blocks_per_sm).
    Fewer, longer blocks than that leave SMs idle: on the H200 (132 SMs, one block each) 128
    blocks of two heads beat 256 blocks of one, 64 blocks lose by half."""
    slots = sm_count * tiling.get("blocks_per_sm", 1)
    query_blocks = (seq_len + tiling["block_m"] - 1) // tiling["block_m"] * batch
    per_block = 1
    while (
        per_block * 2 <= MAX_HEADS_PER_BLOCK
        and heads % (per_block * 2) == 0
        and query_blocks * (heads // (per_block * 2)) * 8 >= slots * 7
    ):
        per_block *= 2
    return per_block


# <<<
