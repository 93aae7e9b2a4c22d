"""linear_attention's fwd and bwd kernels at other tilings, each alone (CUDA events over
back-to-back launches), next to flash-linear-attention's chunk kernels (fla.ops.linear_attn,
when installed) at the spec's bench shapes (B8 S4096 H16 D128, B4 S8192 H16 D64, bf16). Which
chunk / tile / threads / pipeline stages a spec change alone buys. Every tiling's outputs are
checked against the shipped tiling's first (relative Frobenius error of O, dQ, dK, dV); a tiling
that does not build or disagrees is reported and skipped.

On the H200: `python docs/profiling/linear_attention_tiling_probe.py` (kernels build in 16
threads first).
"""
import itertools
import os
import sys
import time

sys.path.insert(0, os.getcwd())
sys.path.insert(0, os.path.join(os.getcwd(), "docs", "profiling"))
import torch

from kernel_probe import compile_all, ms

A = __import__("generated.linear_attention.autograd", fromlist=["x"])
K = __import__("generated.linear_attention.kernels", fromlist=["x"])
SHAPES = [(8, 4096, 16, 128), (4, 8192, 16, 64)]  # batch, seq_len, heads, head dim (Dk = Dv)
DTYPE = "bfloat16"
FWD = [dict(chunk=c, block_dv=v, threads=t, num_stages=s)
       for c, v, t, s in itertools.product((64,), (32, 64, 128), (128, 256), (0, 1, 2))]
BWD = [dict(chunk=c, block_dk=k, block_dv=v, threads=t, num_stages=s)
       for c, k, v, t, s in itertools.product((64,), (64, 128), (32, 64, 128), (128, 256), (0, 1, 2))]
SHIPPED = {"fwd": K.FWD_TILING, "bwd": K.BWD_TILING}


def distinct(tilings, dim):
    """Tilings that differ at this head dim (a tile wider than the dim is the dim)."""
    seen, out = set(), []
    for t in tilings:
        key = tuple((name, min(v, dim) if name.startswith("block") else v) for name, v in t.items())
        if key not in seen:
            seen.add(key)
            out.append(t)
    return out


def main():
    t0 = time.perf_counter()
    jobs = {}
    for batch, seq_len, heads, dim in SHAPES:
        args = (heads, dim, dim, DTYPE, A.scale_for(dim))
        for phase, factory, tilings in (("fwd", K.linear_attention_fwd, FWD),
                                        ("bwd", K.linear_attention_bwd, BWD)):
            for t in distinct([SHIPPED[phase], *tilings], dim):
                key = (phase, dim, tuple(t.items()))
                try:
                    jobs[key] = (factory, factory.get_tir(*args, **t))
                except Exception as exc:
                    print("NO TIR", key, str(exc).splitlines()[-1][:160])
    built = compile_all(jobs, A.entry_point)
    print(f"built {len(built)} kernels in {time.perf_counter() - t0:.0f} s", flush=True)
    try:
        from fla.ops.linear_attn import chunk_linear_attn
    except Exception as exc:
        chunk_linear_attn = None
        print("fla not installed:", exc)
    summary = []
    for batch, seq_len, heads, dim in SHAPES:
        torch.manual_seed(0)
        q, k, v, do = (torch.randn(batch, seq_len, heads, dim, dtype=torch.bfloat16, device="cuda")
                       for _ in range(4))
        o = torch.empty_like(q)
        grads = [torch.zeros(batch, seq_len, heads, dim, dtype=torch.float32, device="cuda")
                 for _ in range(3)]
        scale = A.scale_for(dim)
        print(f"\n# B{batch} S{seq_len} H{heads} D{dim}", flush=True)
        if chunk_linear_attn is not None:
            qf, kf, vf = (t.detach().clone().requires_grad_() for t in (q, k, v))

            def fla_fwd():
                return chunk_linear_attn(qf, kf, vf, scale=scale, normalize=False)[0]

            out = fla_fwd()
            fla_f = ms(fla_fwd, reps=10)
            fla_b = ms(lambda: torch.autograd.grad(out, (qf, kf, vf), do, retain_graph=True), reps=10)
            print(f"fla chunk_linear_attn: fwd {fla_f:.3f} ms  bwd {fla_b:.3f} ms", flush=True)
        else:
            fla_f = fla_b = float("nan")
        refs = {}
        for phase in ("fwd", "bwd"):
            for key in [j for j in jobs if j[0] == phase and j[1] == dim]:
                fn, t = built[key], dict(key[2])
                if not callable(fn):
                    print(f"  {phase} {t}: {fn}")
                    continue
                if phase == "fwd":
                    def call():
                        fn(q, k, v, o)
                    o.fill_(float("nan"))
                    call()
                    outs = [o.float().clone()]
                else:
                    def call():
                        for g in grads:
                            g.zero_()
                        fn(q, k, v, do, *grads)
                    call()
                    outs = [g.clone() for g in grads]
                torch.cuda.synchronize()
                if phase not in refs:
                    refs[phase] = outs  # the shipped tiling's, first
                err = max(((a - b).norm() / b.norm()).item() for a, b in zip(outs, refs[phase]))
                if not err < 2e-2:
                    print(f"  {phase} {t}: DIFFERS from the shipped tiling (rel err {err:.3g})")
                    continue
                t_ms = ms(call, reps=10)
                if phase == "bwd":  # the zero fills are part of what a call does; time them apart too
                    zero_ms = ms(lambda: [g.zero_() for g in grads], reps=10)
                    t_ms -= zero_ms
                base = fla_f if phase == "fwd" else fla_b
                print(f"  {phase} {t}: {t_ms:.3f} ms  {base / t_ms:5.2f}x fla", flush=True)
                summary.append((dim, phase, t, t_ms, base / t_ms))
    print("\nbest per (head dim, phase), kernel alone (bwd without its zero fills):")
    for dim in sorted({s[0] for s in summary}):
        for phase in ("fwd", "bwd"):
            mine = sorted((s for s in summary if s[0] == dim and s[1] == phase), key=lambda s: s[3])
            for s in mine[:3]:
                print(f"  D{dim} {phase} {s[2]} {s[3]:.3f} ms {s[4]:.2f}x fla")
    print(f"total {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
