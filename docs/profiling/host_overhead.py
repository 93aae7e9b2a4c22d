"""Where the host time of a tiny-shape call goes (for the host-overhead work)."""
import cProfile
import io
import os
import pstats
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.getcwd())
OUT = os.environ.get("OUT", ".")
from generated.attention.autograd import attention  # noqa: E402
from generated.rmsnorm.autograd import rmsnorm  # noqa: E402

from host_timing import per_call  # noqa: E402


def report(name, fn):
    print(f"{name:55s} {per_call(fn, n=300, rounds=1, warmup=20):9.1f} us/call", flush=True)


dev = "cuda"
q, k, v = (torch.randn(1, 128, 4, 64, device=dev, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
qt, kt, vt = (t.detach().transpose(1, 2).contiguous().requires_grad_() for t in (q, k, v))
x = torch.randn(8, 1024, device=dev, dtype=torch.bfloat16, requires_grad=True)
w = torch.randn(1024, device=dev, dtype=torch.bfloat16, requires_grad=True)
do = torch.randn_like(q)

report("attention fwd (public)", lambda: attention(q, k, v))
report("sdpa fwd", lambda: F.scaled_dot_product_attention(qt, kt, vt))
report("attention fwd+bwd", lambda: attention(q, k, v).backward(do))
report("sdpa fwd+bwd", lambda: F.scaled_dot_product_attention(qt, kt, vt).backward(do.transpose(1, 2)))
report("rmsnorm fwd", lambda: rmsnorm(x, w))
report("eager rmsnorm fwd", lambda: F.rms_norm(x, (1024,), w, 1e-6))
report("rmsnorm fwd+bwd", lambda: rmsnorm(x, w).sum().backward())
report("eager rmsnorm fwd+bwd", lambda: F.rms_norm(x, (1024,), w, 1e-6).sum().backward())

# The pieces of an attention forward.
from generated.attention import autograd as aa  # noqa: E402
qd, kd, vd = q.detach(), k.detach(), v.detach()
report("attention check_inputs only", lambda: aa.check_inputs(q, k, v, False, None, "bshd"))
report("attention forward_op (custom op, no checks)", lambda: aa.forward_op(q.detach(), k.detach(), v.detach(), False, 0, "bshd"))
report("attention run_forward (no dispatcher)", lambda: aa.run_forward(q.detach(), k.detach(), v.detach(), False, None, "bshd"))
report("attention fwd, inputs without grad", lambda: attention(qd, kd, vd))
report("sdpa fwd, inputs without grad", lambda: F.scaled_dot_product_attention(qt.detach(), kt.detach(), vt.detach()))
pr = cProfile.Profile()
pr.enable()
for _ in range(200):
    attention(q, k, v)
torch.cuda.synchronize()
pr.disable()
s = io.StringIO()
pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(30)
print(s.getvalue()[:9000])
pr = cProfile.Profile()
pr.enable()
for _ in range(100):
    attention(q, k, v).backward(do)
torch.cuda.synchronize()
pr.disable()
s = io.StringIO()
pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(30)
print(s.getvalue()[:9000])

from torch.profiler import ProfilerActivity, profile  # noqa: E402
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    for _ in range(20):
        attention(q, k, v).backward(do)
    torch.cuda.synchronize()
print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=30))
