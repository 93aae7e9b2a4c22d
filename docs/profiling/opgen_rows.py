"""Only the opgen rows of a generated bench, for an A/B of package copies (fwd_grid_probe.py's,
a gqa_base beside gqa) alternated in one GPU call: each run takes seconds instead of the minute
the whole bench spends on its baselines. One process per package (their torch.library ops share
names):

    for p in attention attention_fwd_heads_by_8 attention attention_fwd_heads_by_8; do
        python docs/profiling/opgen_rows.py generated.$p.bench_attention causal; done

The second argument, causal or full, keeps only those bench shapes (window: the windowed ones);
none keeps them all. Timing, shapes and table are the bench's own (its stream_ms and main).
"""

import importlib
import sys

if __name__ == "__main__":
    bench = importlib.import_module(sys.argv[1])
    mask = sys.argv[2] if len(sys.argv) > 2 else None
    every = bench.candidates

    def opgen_only(*args):
        return {name: fn for name, fn in every(*args).items() if name.startswith("opgen")}

    bench.candidates = opgen_only
    causal_field = bench.CASE_FIELDS.index("causal")
    if mask == "window":
        window_field = bench.CASE_FIELDS.index("window")
        shapes = [s for s in bench.SHAPES if s[window_field]]
    else:
        shapes = [s for s in bench.SHAPES if mask is None or s[causal_field] == (mask == "causal")]
    print(f"## {sys.argv[1]}")
    bench.main(shapes, "shapes", bench.Records())
