"""`opgen tune`: time the fwd/bwd tilings the spec's rules accept per (head_dim, causal) and write
the fastest into the spec as [[tiling.tuned]], so that the build stays deterministic and the
choice is committed and reviewed.

The search space per phase is SEARCH_SPACE and PHASE_SPACE (every combination), filtered by the
rules the spec's own tilings obey (shared memory at that head dim, warpgroup layout, the
overlapped forward's threads and pipeline) and by the CPU compile check;
on a GPU each remaining candidate is checked against the package's reference at the tune shape
before it is timed. Selection (pick_winners) and the spec edit (write_tuned) are pure functions.
A run interrupted while timing still writes the variants whose candidates were all timed
(timed_variants); --head-dims tunes some head dims and keeps the others' entries.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib
import itertools
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from opgen.families.attention import (PHASE_TILING, TUNED_PHASES, AttentionBenchShape,
                                      default_softmax_scale, reductions, tiling_problems)
from opgen.families.attention_launch import has_paired_forward, paired_tiling
from opgen.plan import CompileJob

# The candidates of each phase: every combination, in this order (block_m is the query rows of
# a fwd block and the key rows of a bwd block; block_n the other side of its score tile), times
# the phase's own keys of PHASE_SPACE (which override SEARCH_SPACE's). The rules keep block_m =
# 64 * threads / 128 (or 64-192 rows on one warpgroup), the shared memory under 227 KB and the
# overlapped forward on 256 threads. The forward also tries three consumer warpgroups of 64
# query rows (192 x block_n on 384 threads). Not timed (the rules accept them, and a spec's own
# tiling is timed whatever it is): one warpgroup of 128 threads over more than 64 rows, which
# was 1.38-2.85x slower than the winner at all 46 (spec, head dim, mask, phase) tuned on the
# H200 in runs 34-94.
SEARCH_SPACE = {
    "block_m": (64, 128),
    "block_n": (32, 64, 128),
    "threads": (128, 256),
    "num_stages": (1, 2),
}
PHASE_SPACE = {"fwd": {"block_m": (64, 128, 192), "threads": (128, 256, 384),
                       "overlap": (False, True)}, "bwd": {}}
# The shape a head dim is timed at when no [bench] shape has that head dim; a GQA spec's is
# grouped, so that its backward is timed with the dK/dV reduction grouped calls use.
DEFAULT_SHAPE = {"batch": 4, "heads": 16, "kv_heads": 16, "seq_len": 4096}
DEFAULT_GQA_SHAPE = {"batch": 2, "heads": 32, "kv_heads": 8, "seq_len": 4096}
MARKER = "# tuned by opgen tune"


@dataclass(frozen=True)
class Candidate:
    head_dim: int
    causal: bool
    phase: str  # fwd | bwd
    tiling: tuple[tuple[str, int], ...]  # (key, value) pairs as its tiling model dumps them

    @property
    def variant(self) -> tuple[int, bool, str]:
        return self.head_dim, self.causal, self.phase

    @property
    def tiling_dict(self) -> dict[str, int]:
        return dict(self.tiling)

    @property
    def label(self) -> str:
        t = self.tiling_dict
        return (f"{self.phase} d{self.head_dim} {'causal' if self.causal else 'full'} "
                f"{t['block_m']}x{t['block_n']} threads={t['threads']} stages={t['num_stages']}"
                + (" overlap" if t.get("overlap") else ""))


def _as_candidate(dim: int, causal: bool, phase: str, tiling: dict[str, int]) -> Candidate:
    """The tiling as the package prints it (a default left out), so that a candidate equal to a
    spec's tiling is the same candidate and launches the same kernel."""
    dumped = PHASE_TILING[phase](**tiling).model_dump()
    return Candidate(dim, causal, phase, tuple(dumped.items()))


def _worth_timing(tiling: dict[str, int]) -> bool:
    """Whether a search-space tiling is timed: not one warpgroup over more than 64 rows (see
    SEARCH_SPACE)."""
    return tiling["threads"] > 128 or tiling["block_m"] <= 64


def current_tiling(spec: Any, dim: int, causal: bool, phase: str) -> dict[str, int]:
    """The tiling the spec launches phase with at (dim, causal): tuned, else the base one."""
    for entry in spec.tiling.tuned:
        if (entry.head_dim, entry.causal) == (dim, causal) and getattr(entry, phase):
            return getattr(entry, phase).model_dump()
    return getattr(spec.tiling, phase).model_dump()


def candidates(spec: Any, phases: Iterable[str] = TUNED_PHASES,
               max_candidates: int | None = None,
               head_dims: Iterable[int] | None = None) -> list[Candidate]:
    """Per head dim of the spec (those of head_dims, if given), causal and not, and phase: the
    spec's current tiling first, then SEARCH_SPACE's, those the rules accept, at most
    max_candidates of them."""
    found = []
    dims = [d for d in spec.attention.head_dims if head_dims is None or d in head_dims]
    for dim, causal, phase in itertools.product(dims, (False, True), phases):
        keys = {**SEARCH_SPACE, **PHASE_SPACE[phase]}
        space = [tiling for tiling in (dict(zip(keys, values))
                                       for values in itertools.product(*keys.values()))
                 if _worth_timing(tiling)]
        mine: list[Candidate] = []
        for tiling in [current_tiling(spec, dim, causal, phase), *space]:
            candidate = _as_candidate(dim, causal, phase, tiling)
            if candidate in mine or tiling_problems(phase, PHASE_TILING[phase](**tiling), (dim,), causal):
                continue
            mine.append(candidate)
        found += mine[:max_candidates]
    return found


def tune_shape(spec: Any, dim: int) -> dict[str, int]:
    """batch, heads, kv_heads, seq_len a head dim is timed at: its first [bench] shape's, else
    DEFAULT_GQA_SHAPE (attention.gqa) or DEFAULT_SHAPE."""
    for shape in spec.bench.shapes:
        if shape.head_dim == dim:
            return {"batch": shape.batch, "heads": shape.heads,
                    "kv_heads": shape.kv_heads or shape.heads, "seq_len": shape.seq_len}
    return dict(DEFAULT_GQA_SHAPE if spec.attention.gqa else DEFAULT_SHAPE)


def compile_job(spec: Any, plan: Any, candidate: Candidate) -> CompileJob:
    """The kernel a candidate launches at its tune shape (its heads and KV heads, the spec's
    first layout, the bench dtype, the default scale, the shape's dK/dV reductions): the very
    kernel the timing launches, so that on a GPU the timing loads it from TileLang's cache."""
    layout, dtype = spec.attention.layouts[0], spec.bench.dtype
    scale = default_softmax_scale(candidate.head_dim)
    shape = tune_shape(spec, candidate.head_dim)
    heads, kv_heads = shape["heads"], shape["kv_heads"]
    args = (heads, kv_heads, candidate.head_dim, candidate.causal, 0, layout, dtype, scale)
    if candidate.phase == "bwd":
        chosen = reductions(spec)
        dk, dv = (chosen["dk"], chosen["dv"]) if heads > kv_heads else ("direct", "direct")
        args = (*args, dk, dv)
    return CompileJob(plan.kernels[candidate.phase].factory, args, candidate.tiling_dict,
                      candidate.label)


def pick_winners(found: Iterable[Candidate], times: dict[Candidate, float | None]
                 ) -> dict[tuple[int, bool, str], Candidate]:
    """The fastest candidate per (head_dim, causal, phase). A candidate without a time (it failed
    to compile, gave a wrong result, or was not run) cannot win; on a tie the earlier one wins."""
    winners: dict[tuple[int, bool, str], Candidate] = {}
    for candidate in found:
        ms = times.get(candidate)
        if ms is None:
            continue
        best = winners.get(candidate.variant)
        if best is None or ms < times[best]:
            winners[candidate.variant] = candidate
    return winners


def timed_variants(found: Iterable[Candidate], times: dict[Candidate, float | None]
                   ) -> set[tuple[int, bool, str]]:
    """The variants every candidate of which has a result (a time or None): those a run cut off
    while timing may still pick a winner for."""
    variants: dict[tuple[int, bool, str], bool] = {}
    for candidate in found:
        variants[candidate.variant] = variants.get(candidate.variant, True) and candidate in times
    return {v for v, done in variants.items() if done}


def merged_entries(spec: Any, winners: dict[tuple[int, bool, str], Candidate]
                   ) -> dict[tuple[int, bool], dict[str, dict[str, int]]]:
    """The spec's [[tiling.tuned]] entries with the winners in place: (head_dim, causal) ->
    {phase: tiling}; the phases not tuned now keep their earlier entries."""
    entries: dict[tuple[int, bool], dict[str, dict[str, int]]] = {}
    for entry in spec.tiling.tuned:
        for phase in TUNED_PHASES:
            if (tiling := getattr(entry, phase)) is not None:
                entries.setdefault((entry.head_dim, entry.causal), {})[phase] = tiling.model_dump()
    for (dim, causal, phase), candidate in winners.items():
        entries.setdefault((dim, causal), {})[phase] = candidate.tiling_dict
    return entries


def toml_value(value: int | bool) -> str:
    """A tiling value as TOML writes it (a bool is `true`/`false`, not Python's `True`)."""
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def render_tuned(entries: dict[tuple[int, bool], dict[str, dict[str, int]]], comment: str) -> str:
    """[[tiling.tuned]] entries as TOML, sorted, under `comment`."""
    blocks = []
    for (dim, causal) in sorted(entries):
        lines = ["[[tiling.tuned]]", f"head_dim = {dim}", f"causal = {toml_value(causal)}"]
        for phase in TUNED_PHASES:
            if (tiling := entries[dim, causal].get(phase)) is not None:
                inline = ", ".join(f"{k} = {toml_value(v)}" for k, v in tiling.items())
                lines.append(f"{phase} = {{ {inline} }}")
        blocks.append("\n".join(lines) + "\n")
    return f"{comment}\n" + "\n".join(blocks)


_TUNED_HEADER = re.compile(r"^\s*\[\[\s*tiling\s*\.\s*tuned\s*\]\]")
_TILING_HEADER = re.compile(r"^\s*\[{1,2}\s*tiling\s*[.\]]")
_HEADER = re.compile(r"^\s*\[")


def _is_value(line: str) -> bool:
    """A key = value line (not blank, not only a comment, not a table header)."""
    text = line.strip()
    return bool(text) and not text.startswith("#") and not _HEADER.match(line)


def write_tuned(text: str, entries: dict[tuple[int, bool], dict[str, dict[str, int]]],
                comment: str) -> str:
    """The spec's text with its [[tiling.tuned]] entries (and their `# tuned by opgen tune`
    comment) replaced by `entries` under `comment`; every other line as it was. Without earlier
    entries they go after the last [tiling.*] table (else at the end)."""
    lines = text.splitlines(keepends=True)
    removed: set[int] = set()
    for i, line in enumerate(lines):
        if _TUNED_HEADER.match(line):
            j = i
            while j < len(lines) and (j == i or _is_value(lines[j])):
                removed.add(j)
                j += 1
            k = i - 1  # the marker comment above it
            while k >= 0 and lines[k].lstrip().startswith(MARKER):
                removed.add(k)
                k -= 1
    # Blank lines between two removed entries go with them.
    for i, line in enumerate(lines):
        if not line.strip() and i not in removed:
            before = max((j for j in removed if j < i), default=None)
            after = min((j for j in removed if j > i), default=None)
            if before is not None and after is not None and all(
                    not lines[j].strip() or j in removed for j in range(before, after)):
                removed.add(i)
    block = render_tuned(entries, comment) if entries else ""
    if removed and not block and min(removed) > 0 and not lines[min(removed) - 1].strip():
        removed.add(min(removed) - 1)  # the blank line the table was inserted after
    if removed:
        at = min(removed)
        kept = [line for i, line in enumerate(lines) if i not in removed]
        index = at - sum(1 for i in removed if i < at)
        return "".join(kept[:index]) + block + "".join(kept[index:])
    if not block:
        return text
    headers = [i for i, line in enumerate(lines) if _TILING_HEADER.match(line)]
    if headers:
        end = headers[-1]
        for j in range(headers[-1] + 1, len(lines)):
            if _HEADER.match(lines[j]):
                break
            if _is_value(lines[j]):
                end = j
        before, after = lines[:end + 1], lines[end + 1:]
    else:
        before, after = lines, []
    head = "".join(before)
    if head and not head.endswith("\n"):
        head += "\n"
    return head + ("\n" if head else "") + block + "".join(after)


def unified_diff(old: str, new: str, path: str) -> str:
    return "".join(difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True),
                                        f"{path} (before)", f"{path} (tuned)"))


# --- on the GPU --------------------------------------------------------------------------------


@contextlib.contextmanager
def imported_package(files: dict[str, str], name: str, scratch: Path) -> Iterator[Any]:
    """The rendered package, written under scratch and imported (its autograd module), unloaded
    again on exit: left in sys.modules, it would make the spec's own name check fail (the name
    "shadows an installed module") when the tuned spec is validated."""
    package = scratch / name
    package.mkdir(parents=True, exist_ok=True)
    for rel, text in files.items():
        (package / rel).write_text(text, encoding="utf-8")
    sys.path.insert(0, str(scratch))
    try:
        module = importlib.import_module(f"{name}.autograd")
    finally:
        sys.path.remove(str(scratch))
    try:
        yield module
    finally:
        for loaded in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
            del sys.modules[loaded]


def _max_error(got, want) -> float:
    return (got.float() - want.float()).abs().max().item()


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
        job = compile_job(spec, plan, candidate)
        factory = getattr(autograd, job.factory)
        calls.append((factory, job.args, job.tiling))
        if candidate.phase == "fwd" and has_paired_forward(candidate.causal, window=0):
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
    shape, after its output (fwd) or gradients (bwd) matched the reference within the spec's
    tolerance; None for a candidate that failed or was wrong (report says why). Every
    candidate's kernels are built first, `workers` at a time. The results go into `times` as
    they come (a new dict if None), so a caller still has them when the run is interrupted."""
    import torch

    dtype_name = spec.bench.dtype
    dtype = getattr(torch, dtype_name)
    tol = spec.test.tolerance_for(dtype_name)
    layout = spec.attention.layouts[0]
    reference = getattr(autograd, f"{spec.name}_reference")
    # The package bench's timing (back-to-back calls, the median batch): the method of its tables.
    bench = importlib.import_module(f"{autograd.__package__}.bench_{spec.name}")
    names = {phase: plan.kernels[phase].tiling_name for phase in TUNED_PHASES}
    saved = {n: getattr(autograd, n) for p in names.values() for n in (p, p + "S")
             if hasattr(autograd, n)}
    prebuild_candidates(spec, plan, autograd, found, workers)
    times = {} if times is None else times
    by_variant: dict[tuple[int, bool], list[Candidate]] = {}
    for c in found:
        by_variant.setdefault((c.head_dim, c.causal), []).append(c)
    try:
        for (dim, causal), mine in by_variant.items():
            shape = tune_shape(spec, dim)
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
            ref_out = reference(*leaves, causal=causal, layout=layout, softmax_scale=scale)
            ref_grads = torch.autograd.grad(ref_out, leaves, do.float())
            ref_out = ref_out.detach()
            del leaves
            o, lse = autograd.run_forward(*inputs, causal, None, layout, scale)
            for candidate in mine:
                for name, value in saved.items():
                    setattr(autograd, name, value)
                tiling = candidate.tiling_dict
                setattr(autograd, names[candidate.phase], tiling)
                if hasattr(autograd, names[candidate.phase] + "S"):
                    setattr(autograd, names[candidate.phase] + "S", {})
                # The package's call plans hold the kernels of the tiling they were made with.
                autograd.PLANS.clear()
                try:
                    if candidate.phase == "fwd":
                        def call():
                            return autograd.run_forward(*inputs, causal, None, layout, scale)
                        checks = [("O", call()[0], ref_out)]
                    else:
                        def call():
                            return autograd.run_backward(*inputs, o, lse, do, causal, None,
                                                         layout, scale)
                        labels = ("dQ", "dK", "dV", "dsinks")
                        checks = list(zip(labels, call(), ref_grads))
                    wrong = [f"{label} max error {_max_error(got, want):.3g}"
                             for label, got, want in checks
                             if _max_error(got, want) > tol.atol + tol.rtol * want.abs().max().item()]
                    if wrong:
                        times[candidate] = None
                        report(candidate, None, "wrong: " + ", ".join(wrong))
                        continue
                    times[candidate] = bench.stream_ms(call)
                    report(candidate, times[candidate], "")
                except Exception as exc:  # a candidate that fails is dropped, the rest still run
                    times[candidate] = None
                    report(candidate, None, f"failed: {type(exc).__name__}: {exc}".splitlines()[0])
            del inputs, do, o, lse, ref_out, ref_grads
            torch.cuda.empty_cache()
    finally:
        for name, value in saved.items():
            setattr(autograd, name, value)
        autograd.PLANS.clear()
    return times
