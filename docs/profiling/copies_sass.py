"""What ptxas makes of two copies of an attention package (render_copies.sh), on the CPU: for each
case, the fwd and bwd kernels a call launches, compiled for sm_90a; registers, spills and SASS
instructions by kind (static_vs_symbolic_sass.KINDS) side by side. A change to the per-tile code
(a mask, an epilogue) shows here before a GPU call times it. Counts are of code, not executed
instructions: a tile's code runs once per tile it applies to.

    bash docs/profiling/render_copies.sh main base attention_sink
    python docs/profiling/copies_sass.py attention_sink_base attention_sink   # ~2 min on 2 cores
"""
import importlib
import os
import sys
from concurrent.futures import ThreadPoolExecutor

os.environ.setdefault("TILELANG_DEFAULT_TARGET", '{"kind":"cuda","arch":"sm_90a"}')
sys.path.insert(0, os.getcwd())
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from static_vs_symbolic_sass import KINDS, kind_counts, sass

# (heads, kv_heads, head_dim, causal, window, dtype): the attention_sink bench's three shapes
# (sinks + window 1024, the gpt-oss shape, sinks causal), so the copies are of attention_sink.
CASES = [(32, 8, 128, True, 1024, "bfloat16"), (64, 8, 64, True, 128, "bfloat16"),
         (32, 8, 128, True, 0, "bfloat16")]


def jobs(package):
    autograd = importlib.import_module(f"generated.{package}.autograd")
    for heads, kv_heads, dim, causal, window, dtype in CASES:
        calls = autograd.variant_calls(heads, kv_heads, dim, causal, window, "bshd", dtype,
                                       autograd.default_softmax_scale(dim),
                                       autograd.DK_REDUCTION, autograd.DV_REDUCTION)
        for phase in ("fwd", "bwd"):
            factory, args, tiling = calls[phase]
            yield (dim, causal, window, phase, package), factory, args, tiling


def main(packages):
    def build(job):
        case, factory, args, tiling = job
        return case, sass(factory(*args, **tiling))

    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(build, [j for p in packages for j in jobs(p)]))
    print("| D | causal | window | kernel | package | registers | spills | SASS instructions | "
          + " | ".join(KINDS) + " |")
    print("|" + "---|" * (7 + len(KINDS)))
    for case, (registers, spills, ops) in sorted(results, key=lambda r: r[0][:4]):
        print(f"| {' | '.join(map(str, case))} | {registers} | {spills} | {sum(ops.values())} | "
              + " | ".join(map(str, kind_counts(ops))) + " |", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
