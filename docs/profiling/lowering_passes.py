"""Where TVM/TileLang's lowering time goes, pass by pass, for the kernels of one attention variant
(gqa, bf16 D128 causal, the tuned tiling: what a cold first call builds). No GPU needed:
`TILELANG_DEFAULT_TARGET='{"kind":"cuda","arch":"sm_90a"}' python docs/profiling/lowering_passes.py`.
Prints each kernel's total lowering and codegen time and its slowest passes, after a warm-up
kernel."""
import os
import sys
import time
from collections import defaultdict

sys.path.insert(0, os.getcwd())
import tilelang  # noqa: E402
jk = sys.modules["tilelang.jit.kernel"]
from tilelang import tvm  # noqa: E402

tilelang.disable_cache()
from generated.gqa import autograd as ga  # noqa: E402

TIMES = defaultdict(float)
COUNTS = defaultdict(int)


@tvm.instrument.pass_instrument
class PassTimes:
    def __init__(self):
        self.stack = []

    def run_before_pass(self, mod, info):
        self.stack.append(time.perf_counter())

    def run_after_pass(self, mod, info):
        start = self.stack.pop()
        if not self.stack:  # only the outermost pass: nested ones are inside its time
            TIMES[info.name] += time.perf_counter() - start
            COUNTS[info.name] += 1


jk.create_pass_instruments = lambda context=None: [PassTimes()]
WANT = sys.argv[1:] or ["fwd", "bwd", "preprocess", "postprocess"]
calls = ga.variant_calls(16, 4, 128, True, 0, "bshd", "bfloat16", 128**-0.5, *ga.reductions(16, 4))
# The first kernel a process lowers pays ~2 s of TVM's own warm-up (in layout inference among
# others): a small kernel of another variant takes it, so the timed ones compare.
warm = ga.variant_calls(4, 4, 64, False, 0, "bshd", "bfloat16", 0.125, *ga.reductions(4, 4))["postprocess"]
ga.build(warm[0], warm[0].get_tir(*warm[1], **warm[2]))
for key in WANT:
    factory, args, tiling = calls[key]
    TIMES.clear()
    COUNTS.clear()
    t0 = time.perf_counter()
    tir = factory.get_tir(*args, **tiling)
    t1 = time.perf_counter()
    ga.build(factory, tir)
    t2 = time.perf_counter()
    passes = sum(TIMES.values())
    print(f"{key}: get_tir {t1 - t0:.2f} s, build {t2 - t1:.2f} s (passes {passes:.2f} s, the rest codegen + nvcc)")
    for name, sec in sorted(TIMES.items(), key=lambda kv: -kv[1])[:12]:
        print(f"    {sec:6.2f} s  {name} (x{COUNTS[name]})")
