"""`opgen tune` for the attention family: a tiling per (head_dim, causal) and phase (fwd, bwd),
and per window of the bench shapes of a sliding-window spec (an entry with max_window), timed
through the package's run_forward / run_backward at the head dim's (and window's) bench shape."""

from __future__ import annotations

import itertools
from typing import Any, Callable

from opgen import tune
from opgen.families.attention import (PHASE_TILING, TUNED_PHASES,
                                      default_softmax_scale, reductions, tiling_problems,
                                      tuned_key)
from opgen.families.attention_launch import has_paired_forward, paired_tiling, tuned_tiling
from opgen.families.contract import Tuner
from opgen.plan import CompileJob
from opgen.tune import Candidate

# The candidates of each phase: every combination, in this order (block_m is the query rows of a
# fwd block and the key rows of a bwd block; block_n the other side of its score tile), times the
# phase's own keys of PHASE_SPACE (which override SEARCH_SPACE's). The rules keep block_m = 64 *
# threads / 128 (or 64-192 rows on one warpgroup), the shared memory under 227 KB and the
# overlapped and ping-pong forwards on 256 threads. The forward also tries three consumer
# warpgroups of 64 query rows (192 x block_n on 384 threads) and key blocks of 192 rows (the
# ping-pong forward's fastest at head dim 128, GPU run 228). Not timed (the rules accept them,
# and a spec's own tiling is timed whatever it is): one warpgroup of 128 threads over more than 64
# rows, which was 1.38-2.85x slower than the winner at all 46 (spec, head dim, mask, phase) tuned
# on the H200 in runs 34-94 (each such block had the SM to itself). One warpgroup of 64 rows is
# timed on one block an SM and on two, the forward's also on three and four (blocks_per_sm; the
# rules keep such blocks to 128 threads and their share of the SM's shared memory). The backward
# tries dQ by bulk reduce-adds as well as by atomics (bulk_dq), and under a causal mask its query
# blocks walked from the last one down (descending; without a causal mask every block walks them
# all, so the order changes nothing and is not timed).
SEARCH_SPACE = {
    "block_m": (64, 128),
    "block_n": (32, 64, 128),
    "threads": (128, 256),
    "num_stages": (1, 2),
    "blocks_per_sm": (1, 2),
}
PHASE_SPACE = {"fwd": {"block_m": (64, 128, 192), "block_n": (32, 64, 128, 192),
                       "threads": (128, 256, 384),
                       "overlap": (False, True), "pingpong": (False, True),
                       "blocks_per_sm": (1, 2, 3, 4)},
               "bwd": {"bulk_dq": (False, True), "descending": (False, True)}}
# The shape a head dim is timed at when no [bench] shape has that head dim; a GQA spec's is
# grouped, so that its backward is timed with the dK/dV reduction grouped calls use.
DEFAULT_SHAPE = {"batch": 4, "heads": 16, "kv_heads": 16, "seq_len": 4096}
DEFAULT_GQA_SHAPE = {"batch": 2, "heads": 32, "kv_heads": 8, "seq_len": 4096}
def _worth_timing(tiling: dict[str, int]) -> bool:
    """Whether a search-space tiling is timed: not one warpgroup over more than 64 rows (see
    SEARCH_SPACE)."""
    return tiling["threads"] > 128 or tiling["block_m"] <= 64


def tune_shape(spec: Any, dim: int, window: int = 0) -> dict[str, int]:
    """batch, heads, kv_heads, seq_len a head dim is timed at: its first [bench] shape's (with
    this window, for a window's entry), else DEFAULT_GQA_SHAPE (attention.gqa) or
    DEFAULT_SHAPE."""
    for shape in spec.bench.shapes:
        if shape.head_dim == dim and (not window or shape.window == window):
            return {"batch": shape.batch, "heads": shape.heads,
                    "kv_heads": shape.kv_heads or shape.heads, "seq_len": shape.seq_len}
    return dict(DEFAULT_GQA_SHAPE if spec.attention.gqa else DEFAULT_SHAPE)


def compile_job(spec: Any, plan: Any, key: tuple, phase: str, tiling: dict[str, Any],
                label: str) -> CompileJob:
    """The kernel a candidate launches at its tune shape (its heads and KV heads, the spec's
    first layout, the bench dtype, the default scale, the shape's dK/dV reductions): the very
    kernel the timing launches, so that on a GPU the timing loads it from TileLang's cache."""
    dim, causal, window = key
    layout, dtype = spec.attention.layouts[0], spec.bench.dtype
    scale = default_softmax_scale(dim)
    shape = tune_shape(spec, dim, window)
    heads, kv_heads = shape["heads"], shape["kv_heads"]
    args = (heads, kv_heads, dim, causal, window, layout, dtype, scale)
    if phase == "bwd":
        chosen = reductions(spec)
        dk, dv = (chosen["dk"], chosen["dv"]) if heads > kv_heads else ("direct", "direct")
        args = (*args, dk, dv)
    return CompileJob(plan.kernels[phase].factory, args, tiling, label)


def prebuild_candidates(spec: Any, plan: Any, autograd: Any, found: list[Candidate],
                        workers: int) -> None:
    """Build (or load from TileLang's cache, where the compile check put them) the kernel each
    candidate launches, its compile job, `workers` at a time through the package's parallel
    prebuild, before any is timed: built on first launch they would come one by one. The other
    phases' kernels are the base tiling's, built by the first run_forward of each variant.
    A causal forward candidate's call plan also builds its paired forward (which short calls
    run): built here too, or each of them would compile alone while the candidates are timed."""
    calls = []
    for candidate in found:
        job = tune.compile_job(spec, plan, candidate)
        factory = getattr(autograd, job.factory)
        calls.append((factory, job.args, job.tiling))
        if candidate.phase == "fwd" and has_paired_forward(*candidate.key[1:]):
            calls.append((factory, job.args, paired_tiling(job.tiling)))
    for start in range(0, len(calls), workers):
        try:
            autograd.prebuild(calls[start:start + workers])
        except Exception:  # a kernel that fails to build fails its candidate's timing
            pass


def time_candidates(spec: Any, plan: Any, autograd: Any, found: list[Candidate],
                    report: Callable[[Candidate, float | None, str], None],
                    workers: int = 16,
                    times: dict[Candidate, float | None] | None = None
                    ) -> dict[Candidate, float | None]:
    """ms per call of each candidate through the package's run_forward / run_backward at its tune
    shape, after its output (fwd) or gradients (bwd) matched the reference (tune.time_by_key).
    Every candidate's kernels are built first, `workers` at a time."""
    import torch

    dtype = getattr(torch, spec.bench.dtype)
    layout = spec.attention.layouts[0]
    reference = getattr(autograd, f"{spec.name}_reference")
    prebuild_candidates(spec, plan, autograd, found, workers)

    def calls_at(key):
        dim, causal, window = key
        shape = tune_shape(spec, dim, window)
        b, h, kv, s = shape["batch"], shape["heads"], shape["kv_heads"], shape["seq_len"]
        gen = torch.Generator(device="cuda").manual_seed(0)

        def randn(*size, dtype=dtype):
            return torch.randn(*size, generator=gen, device="cuda", dtype=dtype)

        def qkv_shape(heads):
            return (b, s, heads, dim) if layout == "bshd" else (b, heads, s, dim)

        inputs = [randn(*qkv_shape(h)), randn(*qkv_shape(kv)), randn(*qkv_shape(kv))]
        if plan.sinks:
            inputs.append(randn(h, dtype=torch.float32))
        do = randn(*qkv_shape(h))
        scale = default_softmax_scale(dim)
        leaves = [t.detach().float().requires_grad_() for t in inputs]
        windowed = {"window": window} if window else {}
        ref_out = reference(*leaves, causal=causal, layout=layout, softmax_scale=scale, **windowed)
        ref_grads = torch.autograd.grad(ref_out, leaves, do.float())
        ref_out = ref_out.detach()  # its graph freed before the package runs
        o, lse = autograd.run_forward(*inputs, causal, window or None, layout, scale)

        def fwd():
            return autograd.run_forward(*inputs, causal, window or None, layout, scale)

        def bwd():
            return autograd.run_backward(*inputs, o, lse, do, causal, window or None, layout, scale)

        return {"fwd": (fwd, ("O",), (ref_out,)),
                "bwd": (bwd, ("dQ", "dK", "dV", "dsinks"), ref_grads)}

    return tune.time_by_key(spec, plan, autograd, found, report, {} if times is None else times,
                            calls_at)


class AttentionTuner(Tuner):
    phases = TUNED_PHASES
    key_fields = ("head_dim", "causal", "max_window")
    key_defaults = {"max_window": 0}
    subset_options = {"--head-dims": ("head_dim", "the spec's head dims"),
                      "--windows": ("max_window", "the bench shapes' windows (0: none)")}

    def entry_key(self, entry: Any) -> tuple:
        return tuned_key(entry)  # max_window 0 where an entry has none, as the package's tables

    def keys(self, spec: Any) -> list[tuple]:
        """Per head dim: full and causal calls, then causal calls at each window of its bench
        shapes (a sliding-window spec)."""
        keys = []
        for dim in spec.attention.head_dims:
            windows = sorted({s.window for s in spec.bench.shapes
                              if s.head_dim == dim and s.window})
            keys += [(dim, False, 0), (dim, True, 0), *((dim, True, w) for w in windows)]
        return keys

    def current(self, spec: Any, key: tuple, phase: str) -> dict[str, Any]:
        """What the package launches at key now: a window's entry, else the entry for every
        window, else the base tiling (tuned_tiling)."""
        tilings = {k: entry[phase] for k, entry in self.entries(spec).items() if phase in entry}
        dim, causal, window = key
        return tuned_tiling(tilings, getattr(spec.tiling, phase).model_dump(), dim, causal, window)

    def space(self, spec: Any, key: tuple, phase: str) -> list[dict[str, Any]]:
        keys = {**SEARCH_SPACE, **PHASE_SPACE[phase]}
        _, causal, _ = key
        return [tiling for tiling in (dict(zip(keys, values))
                                      for values in itertools.product(*keys.values()))
                if _worth_timing(tiling) and (causal or not tiling.get("descending"))]

    def dump(self, phase: str, tiling: dict[str, Any]) -> dict[str, Any]:
        return PHASE_TILING[phase](**tiling).model_dump()

    def problems(self, spec: Any, key: tuple, phase: str, tiling: dict[str, Any]) -> list:
        dim, causal, _ = key
        return tiling_problems(phase, PHASE_TILING[phase](**tiling), (dim,), causal)

    def compile_job(self, spec, plan, key, phase, tiling, label) -> CompileJob:
        return compile_job(spec, plan, key, phase, tiling, label)

    def describe(self, key: tuple) -> str:
        dim, causal, window = key
        return f"d{dim} {'causal' if causal else 'full'}" + (f" window<={window}" if window else "")

    def describe_tiling(self, tiling: dict[str, Any]) -> str:
        return (f"{tiling['block_m']}x{tiling['block_n']} threads={tiling['threads']} "
                f"stages={tiling['num_stages']}" + (" overlap" if tiling.get("overlap") else "")
                + (" pingpong" if tiling.get("pingpong") else "")
                + (f" {tiling['blocks_per_sm']} blocks/SM" if tiling.get("blocks_per_sm", 1) > 1 else "")
                + (" bulk-dq" if tiling.get("bulk_dq") else "")
                + (" descending" if tiling.get("descending") else ""))

    def time_candidates(self, spec, plan, autograd, found, report, workers, times) -> dict:
        return time_candidates(spec, plan, autograd, found, report, workers, times)


TUNER = AttentionTuner()
