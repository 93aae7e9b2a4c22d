"""Do kernel builds overlap? gqa's fwd and bwd kernels built alone, then together in two
threads, then all four of a variant (fwd, bwd, preprocess, postprocess) in four threads as the
first call builds them: wall and thread CPU seconds of each (TileLang's cache off). Without a GPU set
TILELANG_DEFAULT_TARGET='{"kind":"cuda","arch":"sm_90a"}'."""
import os, sys, time, threading
sys.path.insert(0, os.getcwd())
import tilelang
tilelang.disable_cache()
from generated.gqa import autograd as ga
from concurrent.futures import ThreadPoolExecutor
calls = ga.variant_calls(16, 4, 128, True, 0, "bshd", "bfloat16", 128 ** -0.5, *ga.reductions(16, 4))
def build(name):
    f, args, tiling = calls[name]
    prim = f.get_tir(*args, **tiling)
    w, c = time.perf_counter(), time.thread_time()
    ga.build(f, prim)
    return name, time.perf_counter() - w, time.thread_time() - c
# warm imports: build the small preprocess once
build("preprocess")
for name in ("fwd", "bwd"):
    print("alone", build(name), flush=True)
t = time.perf_counter()
with ThreadPoolExecutor(2) as pool:
    res = list(pool.map(build, ["fwd", "bwd"]))
print("together", res, "wall", round(time.perf_counter() - t, 2), flush=True)
if "--two" not in sys.argv:
    for name in ("preprocess", "postprocess"):
        print("alone", build(name), flush=True)
    t = time.perf_counter()
    with ThreadPoolExecutor(4) as pool:
        res = list(pool.map(build, ["fwd", "bwd", "preprocess", "postprocess"]))
    print("four together", res, "wall", round(time.perf_counter() - t, 2), flush=True)
