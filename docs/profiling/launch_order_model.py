"""How a causal attention grid's launch order sets its makespan: a list-scheduling model.

Blocks start in launch order on the first free block slot (132 SMs, one block each, or four); a block's
time is its number of key/query block steps (causal: key block i of n sees n - i query blocks in
the backward; query block i sees i + 1 key blocks in the forward). Printed: each order's makespan
over the ideal (total work / slots), for launch orders that take n heads at a time, longest first
within them (n = 1: key or query blocks fastest; all: heads fastest). `python
docs/profiling/launch_order_model.py`
"""

import heapq


def makespan(durations, slots):
    free = [0.0] * slots
    for d in durations:
        heapq.heappush(free, heapq.heappop(free) + d)
    return max(free)


def heads_by(n, work, heads):
    """The launch order with n heads at a time, longest first within them (n = heads: heads
    fastest; n = 1: blocks fastest)."""
    return [w for first in range(0, heads, n) for w in work for _ in range(min(n, heads - first))]


def compare(name, blocks, heads, batch, steps_per_block, slots=132):
    work = [steps_per_block * (blocks - i) for i in range(blocks)]  # longest first within a head
    ideal = sum(work) * heads * batch / slots
    # The batch is the grid's slowest dim: n = heads is heads fastest, one batch after another.
    ratios = {n: makespan(heads_by(n, work, heads * batch), slots) / ideal
              for n in (1, 2, 4, 8, 16) if n <= heads}
    print(f"{name} ({slots} block slots), x the ideal makespan with n heads at a time: "
          + ", ".join(f"n={n}{' (heads fastest)' if n == heads else ''} {r:.3f}"
                      for n, r in ratios.items()))


if __name__ == "__main__":
    # gqa's backward with in_block dK/dV: a block per (KV head, key block) walks the group's 4 heads
    compare("GQA bwd B2 32/8 S4096 block_m 128 (in_block)", 32, 8, 2, 4)
    compare("MHA bwd B4 H16 S4096 block_m 128", 32, 16, 4, 1)
    compare("MHA fwd B4 H16 S4096 block_m 128", 32, 16, 4, 1)
    compare("MHA fwd B8 H16 S2048 D64 block_m 64, four blocks an SM", 32, 16, 8, 1, slots=528)
