"""How a causal attention grid's launch order sets its makespan: a list-scheduling model.

Blocks start in launch order on the first free block slot (132 SMs, one block each); a block's
time is its number of key/query block steps (causal: key block i of n sees n - i query blocks in
the backward; query block i sees i + 1 key blocks in the forward). Printed: each order's makespan
over the ideal (total work / slots). `python docs/profiling/launch_order_model.py`
"""

import heapq


def makespan(durations, slots):
    free = [0.0] * slots
    for d in durations:
        heapq.heappush(free, heapq.heappop(free) + d)
    return max(free)


def compare(name, blocks, heads, batch, steps_per_block, slots=132):
    work = [steps_per_block * (blocks - i) for i in range(blocks)]  # longest first within a head
    blocks_fastest = [w for _ in range(batch) for _ in range(heads) for w in work]
    heads_fastest = [w for _ in range(batch) for w in work for _ in range(heads)]
    ideal = sum(work) * heads * batch / slots
    print(f"{name}: blocks fastest {makespan(blocks_fastest, slots) / ideal:.3f}, "
          f"heads fastest {makespan(heads_fastest, slots) / ideal:.3f} (x ideal)")


if __name__ == "__main__":
    # gqa's backward with in_block dK/dV: a block per (KV head, key block) walks the group's 4 heads
    compare("GQA bwd B2 32/8 S4096 block_m 128 (in_block)", 32, 8, 2, 4)
    compare("MHA bwd B4 H16 S4096 block_m 128", 32, 16, 4, 1)
    compare("MHA fwd B4 H16 S4096 block_m 128", 32, 16, 4, 1)
