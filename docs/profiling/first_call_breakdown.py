"""SERIAL=1: build the kernels one by one first (no thread contention).

Where the cold first fwd+bwd of one attention variant (gqa, B2 S1000 H16/4 D128 bf16 causal)
goes: get_tir (main thread), each kernel's build (lowering + nvcc + load, in prebuild's threads),
each nvcc run, CUDA init, the first calls. Without a GPU (TILELANG_DEFAULT_TARGET set) it times
prebuild alone. TileLang's disk cache is off, so every run is cold."""
import os, sys, time, threading
sys.path.insert(0, os.getcwd())
t0 = time.perf_counter()
import tilelang
tilelang.disable_cache()
from tilelang.contrib import nvcc
import tilelang.cuda.backend as be
from generated.gqa import autograd as ga
T0 = time.perf_counter()
print(f"import {T0 - t0:.1f} s")
log = []
def wrap(mod, name, label):
    orig = getattr(mod, name)
    def f(*a, **k):
        s = time.perf_counter()
        try:
            return orig(*a, **k)
        finally:
            log.append((label, threading.current_thread().name, s - T0, time.perf_counter() - T0))
    setattr(mod, name, f)
wrap(be.nvcc, "compile_cuda", "nvcc")
wrap(ga, "build", "build (lower+nvcc)")
wrap(ga, "entry_point", "entry_point (load)")
tl_lower = sys.modules["tilelang.engine.lower"]
for name in ("lower_to_host_device_ir", "host_codegen", "device_codegen"):
    wrap(tl_lower, name, name)
import torch
if torch.cuda.is_available():
    s = time.perf_counter(); torch.zeros(1, device="cuda"); torch.cuda.synchronize()
    log.append(("cuda init", "main", s - T0, time.perf_counter() - T0))
orig_get_tir = type(ga.gqa_fwd).get_tir
def get_tir(self, *a, **k):
    s = time.perf_counter()
    r = orig_get_tir(self, *a, **k)
    log.append(("get_tir " + self.func.__name__ if hasattr(self, "func") else "get_tir", "main", s - T0, time.perf_counter() - T0))
    return r
type(ga.gqa_fwd).get_tir = get_tir
calls = ga.variant_calls(16, 4, 128, True, 0, "bshd", "bfloat16", 128 ** -0.5, *ga.reductions(16, 4))
if os.environ.get("SERIAL"):
    # Each kernel alone, one after another: its lowering without the other threads' contention.
    for factory, args, tiling in calls.values():
        s = time.perf_counter()
        ga.KERNELS[ga.kernel_key(factory, args, tiling)] = ga.entry_point(ga.build(factory, factory.get_tir(*args, **tiling)))
        log.append(("serial " + factory.__name__ if hasattr(factory, "__name__") else "serial", "main", s - T0, time.perf_counter() - T0))
if torch.cuda.is_available():
    q = torch.randn(2, 1000, 16, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.randn(2, 1000, 4, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    s = time.perf_counter()
    o = ga.gqa(q, k, v, causal=True); torch.cuda.synchronize()
    log.append(("first fwd call", "main", s - T0, time.perf_counter() - T0))
    s = time.perf_counter()
    o.sum().backward(); torch.cuda.synchronize()
    log.append(("first bwd call", "main", s - T0, time.perf_counter() - T0))
else:
    ga.prebuild(calls.values())
total = time.perf_counter() - T0
for label, th, s, e in sorted(log, key=lambda r: r[2]):
    print(f"{label:30s} {th:18s} {s:6.2f} -> {e:6.2f}  ({e - s:5.2f} s)")
print(f"prebuild total {total:.2f} s")
