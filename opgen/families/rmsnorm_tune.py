"""`opgen tune` for the rmsnorm family: a tiling per channel count (C) and phase, timed through the
package's run_forward / run_backward at the bench shape of that C.

The best tiling depends on C more than on anything else a call varies: on the H200 (bf16, kernels
alone) the backward was fastest at 64 rows x 1024 channels on 256 threads for C = 4096, at 32 x
1024 on 256 for C = 8192 (64 rows leave SMs idle at 4096 rows) and at 64 x 512 on 128 for C = 1024,
up to 20% faster than the one tiling that serves all three.
"""

from __future__ import annotations

import itertools
from typing import Any, Callable

from opgen import tune
from opgen.families.contract import Tuner
from opgen.families.rmsnorm import (PHASE_TILING, PHASES, saves_rstd, tuned_problems,
                                    widest_element)
from opgen.plan import CompileJob, weight_dtype
from opgen.tune import Candidate

# The candidates of each phase: every combination, in this order, that the rules accept at the C
# (1-64 elements of a chunk per thread, the bwd's w and dw sums of a row within 64 registers a
# thread, the staged rows within shared memory). A fwd block
# normalises block_rows rows at once; a bwd block walks its block_rows rows one at a time, so
# its rows trade dw atomics (partials) against blocks for the SMs, and row_stages the rows in
# flight against blocks an SM.
SEARCH_SPACE = {
    "fwd": {"block_rows": (1, 2, 4), "block_channels": (512, 1024, 2048),
            "threads": (128, 256, 512)},
    "bwd": {"block_rows": (8, 16, 32, 64, 128), "block_channels": (512, 1024, 2048),
            "threads": (128, 256, 512), "row_stages": (2, 3)},
}


def bench_rows(spec: Any, channels: int) -> int:
    """The rows a C is timed at: its first bench shape's."""
    return next(s.rows for s in spec.bench.shapes if s.channels == channels)


def compile_job(spec: Any, plan: Any, key: tuple, phase: str, tiling: dict[str, Any],
                label: str) -> CompileJob:
    """The kernel a candidate launches when it is timed: at its C, the bench dtype and the
    spec's saved rstd (at the bench shape) and dw reduction."""
    (channels,) = key
    dtype = spec.bench.dtype
    args = (channels, dtype, weight_dtype(spec.rmsnorm.weight_dtype, dtype), spec.rmsnorm.eps,
            saves_rstd(spec.saved.rstd, bench_rows(spec, channels) * channels))
    if phase == "bwd":
        args = (*args, spec.grads.dw.reduction)
    return CompileJob(plan.kernels[phase].factory, args, tiling, label)


def time_candidates(spec: Any, plan: Any, autograd: Any, found: list[Candidate],
                    report: Callable[[Candidate, float | None, str], None],
                    times: dict[Candidate, float | None]) -> dict[Candidate, float | None]:
    """ms per call of each candidate through the package's run_forward / run_backward at its
    C's bench shape, with the spec's saved rstd and dw reduction, after its y (fwd) or dx and dw
    (bwd) matched the reference (tune.time_by_key). The kernels come from TileLang's cache,
    where the compile check put them."""
    import torch

    dtype = getattr(torch, spec.bench.dtype)
    w_dtype = getattr(torch, weight_dtype(spec.rmsnorm.weight_dtype, spec.bench.dtype))
    reduction = spec.grads.dw.reduction
    reference = getattr(autograd, f"{spec.name}_reference")

    def calls_at(key):
        (channels,) = key
        gen = torch.Generator(device="cuda").manual_seed(0)
        rows = bench_rows(spec, channels)
        save_rstd = saves_rstd(spec.saved.rstd, rows * channels)
        x = torch.randn(rows, channels, generator=gen, device="cuda", dtype=dtype)
        w = 1 + 0.1 * torch.randn(channels, generator=gen, device="cuda", dtype=w_dtype)
        dy = torch.randn(rows, channels, generator=gen, device="cuda", dtype=dtype)
        leaves = [t.detach().float().requires_grad_() for t in (x, w)]
        ref_y = reference(*leaves)
        ref_grads = torch.autograd.grad(ref_y, leaves, dy.float())
        ref_y = ref_y.detach()
        rstd = autograd.run_forward(x, w, save_rstd)[1]

        def fwd():
            return autograd.run_forward(x, w, save_rstd)

        def bwd():
            return autograd.run_backward(x, rstd, w, dy, reduction)

        return {"fwd": (fwd, ("y",), (ref_y,)), "bwd": (bwd, ("dx", "dw"), ref_grads)}

    return tune.time_by_key(spec, plan, autograd, found, report, times, calls_at)


class RmsnormTuner(Tuner):
    phases = PHASES
    key_fields = ("channels",)
    subset_options = {"--channels": ("channels", "the bench shapes' channel counts")}

    def keys(self, spec: Any) -> list[tuple]:
        return [(c,) for c in dict.fromkeys(s.channels for s in spec.bench.shapes)]

    def space(self, spec: Any, key: tuple, phase: str) -> list[dict[str, Any]]:
        keys = SEARCH_SPACE[phase]
        return [dict(zip(keys, values)) for values in itertools.product(*keys.values())]

    def dump(self, phase: str, tiling: dict[str, Any]) -> dict[str, Any]:
        return PHASE_TILING[phase](**tiling).model_dump()

    def problems(self, spec: Any, key: tuple, phase: str, tiling: dict[str, Any]) -> list:
        (channels,) = key
        return tuned_problems(phase, PHASE_TILING[phase](**tiling), channels, widest_element(spec))

    def compile_job(self, spec, plan, key, phase, tiling, label) -> CompileJob:
        return compile_job(spec, plan, key, phase, tiling, label)

    def describe(self, key: tuple) -> str:
        return f"C={key[0]}"

    def describe_tiling(self, tiling: dict[str, Any]) -> str:
        return (f"{tiling['block_rows']}x{tiling['block_channels']} threads={tiling['threads']}"
                + (f" row_stages={tiling['row_stages']}" if "row_stages" in tiling else ""))

    def time_candidates(self, spec, plan, autograd, found, report, workers, times) -> dict:
        return time_candidates(spec, plan, autograd, found, report, times)


TUNER = RmsnormTuner()
