"""How the attention backward's launch order and query walk set its L2 traffic: a replay model.

Blocks start in launch order on the first free SM (132, one block each); every step takes one
time unit and touches one query tile of one head: q and dO (read) and the fp32 dQ rows (added
by atomics, so they live in L2). The steps of all running blocks are replayed in time order
through an LRU cache of the L2's size; printed per case and order: the bytes that miss it (DRAM
reads) per step, and the makespan over the ideal (total steps / SMs). K and V are read once a
block in every order and left out. Launch orders take n head blocks (heads, or KV heads with
in_block dK/dV) of one batch at a time, key blocks longest first within them, the batch
slowest: n = every head is the shipped causal grid (heads fastest), n = 1 key blocks fastest
(the full grid's). A model, not a measurement: no bandwidth, no latency, no hardware replacement
policy; what it is for is ranking orders before a GPU call.
`python docs/profiling/walk_order_model.py [L2 MB]` (50 by default; the tiles may get less of it).

Checked against the H100: with the shipped grid it puts walking down ahead for GQA causal
(11.9 against 39.8 KB a step; run 162: 11-12% faster) and far behind at window 1024 (25.2
against 4.3; run 164: 1.34x slower), and MHA D128 causal level-ish (6.8 against 3.9; run 162:
level), with the causal MHA backward at ~2x the full one's traffic (run 154: 3x the DRAM reads
per unit of work). Where it was wrong: it put 4 or 8 heads at a time at the MHA causal
backward's traffic floor, and run 166 measured 1.5% faster on MHA D128 and 3% slower with
grouped heads; traffic alone does not rank orders whose makespans differ little.
Session 42, the window-1024 backward on its run-167 tiling (128-key blocks, 64-row query tiles):
the model has the shipped order missing 49% of the tile bytes (ncu, run 185: L2 hit rate 56%)
and key blocks fastest 86% (run 182: 24% slower), but in_block walking one head at a time
("heads outer") 14%, and run 186 measured that 11% slower: either the hit rate it gains is
not what that kernel waits on, or its stride through dQ rows costs more than the model's LRU
sees; an ncu of both copies says which.
"""

import heapq
from collections import OrderedDict

L2_BYTES = 50 * 2**20  # H100 SXM
SMS = 132


def walks(key_blocks, query_blocks, block_ratio, causal, window_blocks):
    """Per key block, the query blocks it walks, ascending (block_ratio: query blocks per key
    block's rows; window_blocks: query blocks a key block sees past its diagonal, 0 for none)."""
    out = []
    for by in range(key_blocks):
        start = by * block_ratio if causal else 0
        end = min(start + block_ratio + window_blocks, query_blocks) if window_blocks else query_blocks
        out.append(list(range(start, end)))
    return out


def blocks_in_launch_order(n, key_blocks, head_blocks, batch):
    """(key block, head block of every batch) in launch order: n head blocks of a batch at a time,
    key blocks longest first within them (heads fastest among the n), the batch slowest."""
    return [(by, b * head_blocks + hb) for b in range(batch) for first in range(0, head_blocks, n)
            for by in range(key_blocks) for hb in range(first, min(first + n, head_blocks))]


def replay(case, n, order):
    """(DRAM bytes per step, makespan / ideal) of n head blocks at a time, walking order."""
    key_blocks, query_blocks = case["key_blocks"], case["query_blocks"]
    group, head_blocks = case["group"], case["head_blocks"]
    per_walk = walks(key_blocks, query_blocks, case["ratio"], case["causal"], case["window"])
    tile_bytes = case["rows"] * case["dim"] * (2 + 2 + 4)  # q, dO in 16 bits; dQ in fp32
    # Each block's steps in its walk order: (query block, head within its group).
    def steps(by, hb):
        walk = per_walk[by]
        if order == "down":
            walk = walk[::-1]
        if order == "heads outer":  # in_block: every query block of one head, then the next head
            return [(k, hb * group + g) for g in range(group) for k in walk]
        return [(k, hb * group + g) for k in walk for g in range(group)]

    accesses = []  # (time, slot, tile)
    free = [(0, slot) for slot in range(SMS)]
    heapq.heapify(free)
    total = 0
    for by, hb in blocks_in_launch_order(n, key_blocks, head_blocks, case["batch"]):
        start, slot = heapq.heappop(free)
        walk = steps(by, hb)
        for t, (k, head) in enumerate(walk):
            accesses.append((start + t, slot, (head, k)))
        total += len(walk)
        heapq.heappush(free, (start + len(walk), slot))
    makespan = max(t for t, _ in free)
    accesses.sort()
    cache, held, missed = OrderedDict(), 0, 0
    for _, _, tile in accesses:
        if tile in cache:
            cache.move_to_end(tile)
            continue
        missed += tile_bytes
        cache[tile] = True
        held += tile_bytes
        while held > L2_BYTES:
            cache.popitem(last=False)
            held -= tile_bytes
    return missed / total, makespan / (total / SMS)


CASES = {
    # B4 H16 S4096; block_m 128, block_n 64 (D128) or 128 (D64).
    "MHA D128 causal": dict(key_blocks=32, query_blocks=64, ratio=2, causal=True, window=0,
                            group=1, head_blocks=16, batch=4, rows=64, dim=128),
    "MHA D64 causal": dict(key_blocks=32, query_blocks=32, ratio=1, causal=True, window=0,
                           group=1, head_blocks=16, batch=4, rows=128, dim=64),
    "MHA D128 full": dict(key_blocks=32, query_blocks=64, ratio=2, causal=False, window=0,
                          group=1, head_blocks=16, batch=4, rows=64, dim=128),
    # B2 32/8 in_block: a block per KV head walks its group's 4 query heads.
    "GQA D128 causal": dict(key_blocks=32, query_blocks=64, ratio=2, causal=True, window=0,
                            group=4, head_blocks=8, batch=2, rows=64, dim=128),
    # sinks at window 1024 on 128-key blocks and 64-row query tiles (the tuned tiling since
    # run 167; session 38's log is of 64 x 64 blocks): 16 query blocks past the diagonal's two.
    "GQA D128 window 1024": dict(key_blocks=32, query_blocks=64, ratio=2, causal=True, window=16,
                                 group=4, head_blocks=8, batch=2, rows=64, dim=128),
}

if __name__ == "__main__":
    import sys

    L2_BYTES = int(sys.argv[1]) * 2**20 if len(sys.argv) > 1 else L2_BYTES
    print(f"L2 of {L2_BYTES >> 20} MB")
    orders = ("up", "down", "heads outer")
    print("case | head blocks at a time | " + " | ".join(
        f"{o}: DRAM KB a step, makespan / ideal" for o in orders))
    for name, case in CASES.items():
        for n in (1, 2, 4, 8, 16):
            if n > case["head_blocks"] or (not case["causal"] and n > 1):
                continue  # full grids launch key blocks fastest (n = 1)
            shipped = " (shipped)" if n == (case["head_blocks"] if case["causal"] else 1) else ""
            cells = []
            for order in orders:
                traffic, span = replay(case, n, order)
                cells.append(f"{traffic / 1024:.1f}, {span:.3f}")
            print(f"{name} | {n}{shipped} | " + " | ".join(cells))
