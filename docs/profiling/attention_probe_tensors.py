"""The tensors the attention forward probes share: q, k, v of a case (bshd, random normal, seeded)
and a forward kernel's launch into fresh O and lse (lse's rows padded to a multiple of 8, as the
package's kernels take them)."""
import torch


def pad8(s):
    return (s + 7) // 8 * 8


def inputs(b, h, kv, s, d, dt, seed=0):
    """q [b, s, h, d], k and v [b, s, kv, d] in dtype dt (a torch dtype's name), on the GPU."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    dtype = getattr(torch, dt)
    return [torch.randn(b, s, n, d, device="cuda", dtype=dtype, generator=g) for n in (h, kv, kv)]


def launch(entry, q, k, v):
    """O and lse of a forward entry point called as entry(q, k, v, o, lse)."""
    b, s, h, d = q.shape
    o = torch.empty_like(q)
    lse = torch.empty(b, h, pad8(s), device="cuda")
    entry(q, k, v, o, lse)
    return o, lse
