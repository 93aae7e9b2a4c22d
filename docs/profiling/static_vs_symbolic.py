"""The shipped attention kernels (batch and seq_len symbolic: one kernel per variant) against the
same kernels compiled for one shape (batch, seq_len and the padded rows constants), through the
public function, in one process: issue 10's "within 3% of static kernels" with today's kernels
(run 23a compared against commit 2c26cb1's, since rewritten).

The static copies are the package's own kernels.py with runtime_dims() and padded_dim() returning
the shape's numbers; they are put into autograd's kernel table under the symbolic kernels' keys,
so attention() launches them with everything else unchanged. Rounds alternate symbolic, static,
symbolic, static (ms fwd and bwd by kernel_probe.ms: back-to-back calls); the table has each
one's best round, then every round.

    python docs/profiling/static_vs_symbolic.py          # the bench shapes of generated/attention
    python docs/profiling/static_vs_symbolic.py ncu static 128 causal   # one case's forward,
        # with the static (or symbolic) kernels, four times: for Nsight Compute, e.g.
        # ncu --clock-control none -k regex:'^fwd' --launch-skip 3 --launch-count 1 ...
"""
import importlib.util
import os
import sys
import tempfile
import time

sys.path.insert(0, os.getcwd())
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch

from generated.attention import autograd as A
from generated.attention import kernels as K
from kernel_probe import compile_all, ms

CASES = [(4, 16, 4096, 128, False), (4, 16, 4096, 128, True), (4, 16, 4096, 64, False),
         (4, 16, 4096, 64, True)]
SOURCE = open(K.__file__).read()
SYMBOLIC_DIMS = 'return T.dynamic("batch"), T.dynamic("seq_len")'
SYMBOLIC_ROWS = 'return T.dynamic("padded_rows")'
assert SYMBOLIC_DIMS in SOURCE and SYMBOLIC_ROWS in SOURCE, "runtime_dims() or padded_dim() changed"


def static_module(batch, seq_len):
    """kernels.py with batch, seq_len and the padded rows fixed."""
    text = SOURCE.replace(SYMBOLIC_DIMS, f"return {batch}, {seq_len}").replace(
        SYMBOLIC_ROWS, f"return {K.padded_rows(seq_len)}")
    # A file, not exec'd text: TileLang's parser reads the kernels' source back from their file.
    name = f"static_kernels_{batch}_{seq_len}"
    path = os.path.join(tempfile.mkdtemp(), name + ".py")
    with open(path, "w") as f:
        f.write(text)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def factory_name(factory):
    return next(n for n, v in vars(K).items() if v is factory)


def bench_calls(heads, dim, causal):
    """attention()'s (factory, args, tiling) of each phase for an MHA fp16 bshd call."""
    return A.variant_calls(heads, heads, dim, causal, 0, "bshd", "float16", A.default_softmax_scale(dim),
                           A.DK_REDUCTION, A.DV_REDUCTION)


def static_jobs(calls, batch, seq_len):
    """{the symbolic kernel's key: (static factory, its prim_func)} of each of calls at one shape."""
    module = static_module(batch, seq_len)
    jobs = {}
    for f, args, tiling in calls.values():
        static_factory = getattr(module, factory_name(f))
        jobs[A.kernel_key(f, args, tiling)] = (static_factory, static_factory.get_tir(*args, **tiling))
    return jobs


def main():
    start = time.perf_counter()
    tables, jobs = [], {}
    for b, h, s, d, causal in CASES:
        calls = bench_calls(h, d, causal)
        A.prebuild(calls.values())
        symbolic = {A.kernel_key(f, args, tiling): A.KERNELS[A.kernel_key(f, args, tiling)]
                    for f, args, tiling in calls.values()}
        jobs.update({(b, s, key): job for key, job in static_jobs(calls, b, s).items()})
        tables.append(((b, h, s, d, causal), symbolic))
    built = compile_all(jobs, A.entry_point)  # at once, in threads
    failed = {key: why for key, why in built.items() if isinstance(why, str)}
    assert not failed, failed
    tables = [(case, symbolic, {key: built[(case[0], case[2], key)] for key in symbolic})
              for case, symbolic in tables]
    print(f"built in {time.perf_counter() - start:.0f} s", flush=True)
    print("| B | H | S | D | causal | fwd symbolic | fwd static | speed symbolic / static | bwd symbolic | bwd static | speed symbolic / static |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for (b, h, s, d, causal), symbolic, static in tables:
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v, do = (torch.randn(b, s, h, d, device="cuda", dtype=torch.float16, generator=g)
                       for _ in range(4))
        q.requires_grad_(), k.requires_grad_(), v.requires_grad_()
        out = {}
        for round_ in range(2):
            for name, kernels in (("symbolic", symbolic), ("static", static)):
                A.KERNELS.update(kernels)
                A.PLANS.clear()  # its launchers hold the kernels they looked up
                n_kernels = len(A.KERNELS)
                fwd = ms(lambda: A.attention(q, k, v, causal))
                o = A.attention(q, k, v, causal)
                bwd = ms(lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True))
                # A call whose kernels were not the table's would have built new ones.
                assert len(A.KERNELS) == n_kernels, "attention() built kernels outside the table"
                out.setdefault(name, []).append((fwd, bwd))
        (sym_f, sym_b), (sta_f, sta_b) = (tuple(map(min, zip(*out[name]))) for name in ("symbolic", "static"))
        print(f"| {b} | {h} | {s} | {d} | {causal} | {sym_f:.3f} | {sta_f:.3f} | {sta_f / sym_f:.3f}x "
              f"| {sym_b:.3f} | {sta_b:.3f} | {sta_b / sym_b:.3f}x |  rounds {out}", flush=True)


def ncu_case(mode, dim, causal):
    """Four forwards of the MHA bench shape at dim with the static or symbolic kernels."""
    b, h, s = 4, 16, 4096
    calls = bench_calls(h, dim, causal)
    A.prebuild(calls.values())
    if mode == "static":
        A.KERNELS.update(compile_all(static_jobs(calls, b, s), A.entry_point))
        A.PLANS.clear()
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(b, s, h, dim, device="cuda", dtype=torch.float16, generator=g) for _ in range(3))
    for _ in range(4):
        A.attention(q, k, v, causal)
    torch.cuda.synchronize()


if __name__ == "__main__":
    if sys.argv[1:2] == ["ncu"]:
        ncu_case(sys.argv[2], int(sys.argv[3]), sys.argv[4:5] == ["causal"])
    else:
        main()
