"""The generated ops on a machine with two GPUs, and a small model of the generated modules under
DDP and FSDP2 (project issue "Two GPUs: ops on a non-default device, and under DDP and FSDP2").

Needs >= 2 CUDA GPUs (skipped otherwise), for every package:
- test_op_on_a_non_current_device: the public function on cuda:1 while cuda:0 is the current
  device, and on cuda:0 while cuda:1 is, on a non-default stream of the tensors' device. Output
  and every gradient match the package's reference (reference.py on the same device, float32
  math) within the package's own per-dtype tolerances (its test module's TOLERANCES); the
  caller's current device is the same after the forward and after the backward; nothing is
  allocated on the caller's device; the kernels run on the side stream (its inputs are written
  on that stream after a GPU sleep, so a kernel queued on another stream reads zeros).
- test_inputs_on_two_devices_raise: one input on the other GPU raises ValueError naming both
  devices, before any launch (the package's apply_op and kernel are replaced by failures).
- test_distributed_matches_single_gpu: examples/distributed_step.py under
  `torchrun --standalone --nproc-per-node 2` in ddp and fsdp2 mode against its --mode single
  run on one GPU (NCCL, NCCL_NVLS_ENABLE=0; other NCCL_* variables as the machine sets them).

Runs everywhere (CPU, gloo; the generated ops run their reference on CPU tensors):
- test_distributed_on_cpu_matches_single: the same script with --device cpu --config tiny.

Distributed tolerances (bf16 activations, fp32 parameters; each rank computes half the batch, so
every weight gradient is two bf16 partial sums averaged instead of one bf16 sum, and AdamW steps
on gradients that differ in their last bits): per-step loss rtol LOSS_RTOL; per-parameter
gradient norm rtol GRAD_NORM_RTOL; per-parameter relative L2 error of the whole gradient
||g - g_single|| / ||g_single|| at most GRAD_REL_ERR. (Seen on the CPU: losses within 6e-5,
norms within 1.1e-3, relative errors up to 3.0e-3.)

    python -m pytest tests/test_two_gpus.py -v       # on the 2-GPU machine: nothing skipped
"""

from __future__ import annotations

import importlib
import json
import math
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pytest
import torch

REPO_ROOT = Path(__file__).resolve().parent.parent
SCRIPT = REPO_ROOT / "examples" / "distributed_step.py"
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

GPU_COUNT = torch.cuda.device_count() if torch.cuda.is_available() else 0
requires_two_gpus = pytest.mark.skipif(
    GPU_COUNT < 2,
    reason=f"needs 2 CUDA GPUs (found {GPU_COUNT}): ops on a non-current device, inputs on two "
    "devices, DDP and FSDP2 over NCCL",
)

# Distributed runs against the single-device run (module docstring).
LOSS_RTOL = 5e-3
GRAD_NORM_RTOL = 2e-2
GRAD_REL_ERR = 2e-2
# One command of torchrun or the single run; the first GPU run compiles the TileLang kernels.
RUN_TIMEOUT_S = 900
# torch.cuda._sleep cycles before the side stream writes the inputs: ~0.1 s on an H200, far
# longer than the host takes to queue an op's (already compiled) kernels.
SLEEP_CYCLES = 200_000_000


# ---- the ops on a non-current device ----------------------------------------------------------


def randn(*shape, scale=1.0):
    return torch.randn(*shape) * scale


@dataclass(frozen=True)
class Case:
    """One call of a package's public function: `make(dtype)` gives the inputs (CPU tensors,
    in call order) and the upstream gradient; function(*inputs, **kwargs) and
    reference(*inputs, **kwargs) are compared."""

    package: str
    function: str
    reference: str
    make: Callable[[torch.dtype], tuple[dict[str, torch.Tensor], torch.Tensor]]
    kwargs: dict = field(default_factory=dict)


def rmsnorm_inputs(dt):
    # Rows of different scales have different rstd (as generated/rmsnorm's test draws them).
    x = (randn(3, 333, 77) * randn(3, 333, 1).exp()).to(dt)
    return {"x": x, "w": randn(77).to(dt)}, randn(3, 333, 77).to(dt)


def attention_inputs(q_shape, kv_shape, sinks=None):
    def make(dt):
        inputs = {"q": randn(*q_shape).to(dt), "k": randn(*kv_shape).to(dt),
                  "v": randn(*kv_shape).to(dt)}
        if sinks is not None:
            inputs["sinks"] = randn(sinks)  # float32, as the spec's sinks dtype
        return inputs, randn(*q_shape).to(dt)

    return make


CASES = {
    "rmsnorm": Case("rmsnorm", "rmsnorm", "rmsnorm_reference", rmsnorm_inputs),
    "matmul": Case(
        "matmul", "matmul", "matmul_reference",
        lambda dt: ({"a": randn(2, 77, 336).to(dt), "b": randn(336, 777).to(dt),
                     "bias": randn(777).to(dt)}, randn(2, 77, 777).to(dt)),
    ),
    "attention-bshd-causal": Case(
        "attention", "attention", "attention_reference",
        attention_inputs((2, 333, 3, 64), (2, 333, 3, 64)), dict(causal=True, layout="bshd"),
    ),
    "attention-bhsd-full": Case(
        "attention", "attention", "attention_reference",
        attention_inputs((1, 3, 333, 128), (1, 3, 333, 128)), dict(causal=False, layout="bhsd"),
    ),
    "gqa": Case(
        "gqa", "gqa", "gqa_reference",
        attention_inputs((1, 333, 8, 64), (1, 333, 2, 64)), dict(causal=True, layout="bshd"),
    ),
    "attention_sink": Case(
        "attention_sink", "attention_sink", "attention_sink_reference",
        attention_inputs((1, 333, 8, 64), (1, 333, 2, 64), sinks=8),
        dict(causal=True, window=100, layout="bshd"),
    ),
    "swiglu": Case(
        "swiglu", "swiglu", "swiglu_reference",
        # 4 * randn reaches both flat ends of the sigmoid.
        lambda dt: ({"a": randn(3, 333, 77, scale=4).to(dt), "b": randn(3, 333, 77).to(dt)},
                    randn(3, 333, 77).to(dt)),
    ),
    "scaled_silu": Case(
        "scaled_silu", "scaled_silu", "scaled_silu_reference",
        lambda dt: ({"x": randn(3, 333, 77, scale=4).to(dt), "w": randn(())},
                    randn(3, 333, 77).to(dt)),
    ),
    "linear_attention": Case(
        "linear_attention", "linear_attention", "linear_attention_reference",
        lambda dt: ({"q": randn(1, 333, 2, 64).to(dt), "k": randn(1, 333, 2, 64).to(dt),
                     "v": randn(1, 333, 2, 128).to(dt)}, randn(1, 333, 2, 128).to(dt)),
    ),
}
PACKAGES = sorted({case.package for case in CASES.values()})
DTYPES = [pytest.param(torch.float16, id="fp16"), pytest.param(torch.bfloat16, id="bf16")]
# (the tensors' device, the caller's current device)
DEVICES = [pytest.param((1, 0), id="on-cuda1-from-cuda0"),
           pytest.param((0, 1), id="on-cuda0-from-cuda1")]


def test_every_package_has_a_case():
    """A package added to generated/ gets a case here too (runs on the CPU)."""
    shipped = sorted(p.parent.name for p in (REPO_ROOT / "generated").glob("*/__init__.py")
                     if not p.parent.name.startswith("."))  # a build's leftovers
    assert PACKAGES == shipped


@pytest.mark.parametrize("name", list(CASES))
def test_case_runs_on_the_cpu(name):
    """Each case's inputs pass the package's checks and its call runs forward and backward (the
    reference, on the CPU): the GPU tests above are not first run on the 2-GPU machine."""
    case, values, dy = make_case(name, torch.bfloat16)
    function = getattr(importlib.import_module(f"generated.{case.package}"), case.function)
    inputs = {n: t.clone().requires_grad_() for n, t in values.items()}
    out = function(*inputs.values(), **case.kwargs)
    assert out.shape == dy.shape and out.dtype == dy.dtype
    out.backward(dy)
    for n, t in inputs.items():
        assert t.grad is not None and t.grad.shape == t.shape, n


def make_case(name, dtype):
    """(case, its inputs on the CPU, dy on the CPU), the same values on every call."""
    case = CASES[name]
    torch.manual_seed(0)
    inputs, dy = case.make(dtype)
    return case, inputs, dy


def tolerances(package, dtype):
    """(rtol, atol) of the package's own test module, for dtype."""
    return importlib.import_module(f"generated.{package}.test_{package}").TOLERANCES[dtype]


def assert_close(label, actual, expected, tol, where):
    rtol, atol = tol
    assert actual.shape == expected.shape, (
        f"{label} {where}: shape {tuple(actual.shape)} != reference {tuple(expected.shape)}")
    assert actual.dtype == expected.dtype, (
        f"{label} {where}: dtype {actual.dtype} != reference {expected.dtype}")
    assert actual.device == expected.device, (
        f"{label} {where}: on {actual.device}, the reference on {expected.device}")
    a, e = actual.double(), expected.double()
    err = (a - e).abs().max().item() if a.numel() else 0.0
    assert torch.allclose(a, e, rtol=rtol, atol=atol), (
        f"{label} {where}: max err {err:.4g} (rtol={rtol}, atol={atol}), "
        f"max |ref| {e.abs().max().item():.4g}")


@pytest.fixture
def no_tf32(monkeypatch):
    """The references' float32 matmuls in full float32 (PyTorch's default, made sure of)."""
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)


def run_on_side_stream(function, inputs, values, dy, dy_value, kwargs, caller, sleep):
    """function(*inputs, **kwargs) and its backward, with `caller` the current device and a new
    stream current on the tensors' device; returns the output once that stream is done. The
    inputs (leaves) and dy are written from `values` and `dy_value` on that stream, after a GPU
    sleep when `sleep`. Asserts the current device after the forward and after the backward."""
    device = dy.device
    stream = torch.cuda.Stream(device=device)
    stream.wait_stream(torch.cuda.current_stream(device))  # the inputs' allocation and fill
    with torch.cuda.device(caller):
        # torch.cuda.stream makes the stream's device current as well: the caller's device is
        # made current again inside, while the stream stays current on the tensors' device.
        with torch.cuda.stream(stream):
            if sleep:
                with torch.cuda.device(device):  # on the side stream, whatever device is current
                    torch.cuda._sleep(SLEEP_CYCLES)
            with torch.no_grad():
                for t, value in zip(inputs.values(), values.values()):
                    t.copy_(value)
                dy.copy_(dy_value)
            with torch.cuda.device(caller):
                assert torch.cuda.current_device() == caller
                assert torch.cuda.current_stream(device) == stream
                before = torch.cuda.memory_allocated(caller)
                out = function(*inputs.values(), **kwargs)
                assert torch.cuda.current_device() == caller, (
                    f"the forward on {device} left cuda:{torch.cuda.current_device()} current, "
                    f"not the caller's cuda:{caller}")
                out.backward(dy)
                assert torch.cuda.current_device() == caller, (
                    f"the backward on {device} left cuda:{torch.cuda.current_device()} current, "
                    f"not the caller's cuda:{caller}")
                allocated = torch.cuda.memory_allocated(caller) - before
                assert allocated == 0, (
                    f"a call on {device} allocated {allocated} bytes on the caller's cuda:{caller}")
        assert torch.cuda.current_device() == caller
    stream.synchronize()
    return out


@requires_two_gpus
@pytest.mark.parametrize("devices", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", list(CASES))
def test_op_on_a_non_current_device(name, dtype, devices, no_tf32):
    target, caller = devices
    device = torch.device("cuda", target)
    case, cpu_values, cpu_dy = make_case(name, dtype)
    function = getattr(importlib.import_module(f"generated.{case.package}"), case.function)
    reference = getattr(importlib.import_module(f"generated.{case.package}.reference"),
                        case.reference)
    tol = tolerances(case.package, dtype)
    where = f"on {device} (current device cuda:{caller}, a side stream)"

    values = {n: t.to(device) for n, t in cpu_values.items()}
    dy_value = cpu_dy.to(device)
    # Leaves and dy that the side stream fills: zeros until it does.
    inputs = {n: torch.zeros_like(t).requires_grad_() for n, t in values.items()}
    dy = torch.zeros_like(dy_value)
    torch.cuda.synchronize(device)

    # The first call builds the kernels (host time the GPU sleep would not cover): a warm-up,
    # checked the same way, then the call that is compared.
    run_on_side_stream(function, inputs, values, dy, dy_value, case.kwargs, caller, sleep=False)
    for t in inputs.values():
        t.grad = None
    out = run_on_side_stream(function, inputs, values, dy, dy_value, case.kwargs, caller,
                             sleep=True)

    # The reference: same values, same device, its default stream.
    leaves = {n: t.detach().clone().requires_grad_() for n, t in values.items()}
    expected = reference(*leaves.values(), **case.kwargs)
    expected.backward(dy_value)
    torch.cuda.synchronize(device)

    assert_close("output", out, expected, tol, where)
    for n, t in inputs.items():
        assert t.grad is not None, f"d{n} {where}: no gradient"
        assert_close(f"d{n}", t.grad, leaves[n].grad, tol, where)


@requires_two_gpus
@pytest.mark.parametrize("devices", DEVICES)
@pytest.mark.parametrize("name", list(CASES))
def test_inputs_on_two_devices_raise(name, devices, monkeypatch):
    """Each input in turn on the other GPU: ValueError naming both devices, and no launch."""
    target, other = (torch.device("cuda", i) for i in devices)
    case, cpu_values, _ = make_case(name, torch.bfloat16)
    autograd = importlib.import_module(f"generated.{case.package}.autograd")
    function = getattr(autograd, case.function)

    def launched(*args, **kwargs):
        pytest.fail(f"{case.package}: a launch was attempted with inputs on two devices")

    monkeypatch.setattr(autograd, "apply_op", launched)
    monkeypatch.setattr(autograd, "kernel", launched)
    current = torch.cuda.current_device()
    for moved in cpu_values:
        inputs = {n: t.to(other if n == moved else target).requires_grad_()
                  for n, t in cpu_values.items()}
        with pytest.raises(ValueError) as info:
            function(*inputs.values(), **case.kwargs)
        message = str(info.value)
        assert str(target) in message and str(other) in message, (
            f"{case.package} with {moved} on {other}, the rest on {target}: the error does not "
            f"name both devices: {message!r}")
        assert torch.cuda.current_device() == current


# ---- DDP and FSDP2 against one device ------------------------------------------------------------


def run_step(mode, device, out_dir, args=()):
    """Run examples/distributed_step.py in `mode` (single: one process; ddp, fsdp2: torchrun
    with 2 processes); returns (its JSON result, its first-step gradients)."""
    out, grads = out_dir / f"{mode}.json", out_dir / f"{mode}.pt"
    script = [str(SCRIPT), "--mode", mode, "--device", device, "--out", str(out),
              "--grads", str(grads), *args]
    if mode == "single":
        command = [sys.executable, *script]
    else:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                   "--nproc-per-node", "2", *script]
    env = dict(os.environ)  # the machine's NCCL_* settings stay
    env["NCCL_NVLS_ENABLE"] = "0"  # no NVLink multicast (NVLS)
    env.setdefault("OMP_NUM_THREADS", "1")
    proc = subprocess.run(command, cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert proc.returncode == 0, (
        f"{' '.join(command)} exited {proc.returncode}\n--- stdout\n{proc.stdout[-5000:]}\n"
        f"--- stderr\n{proc.stderr[-5000:]}")
    return json.loads(out.read_text()), torch.load(grads)


def compare_runs(single, other):
    """Every difference of `other` (ddp or fsdp2: JSON, gradients) from `single`, at once."""
    (s, s_grads), (o, o_grads) = single, other
    label = f"{o['mode']} ({o['world_size']} ranks)"
    assert o["world_size"] == 2, f"{label}: expected 2 ranks"
    assert len(o["losses"]) == len(s["losses"]) == s["steps"]
    assert s["losses"][-1] < s["losses"][0], f"single: the loss did not fall: {s['losses']}"
    assert o_grads.keys() == s_grads.keys() == s["grad_norms"].keys() == o["grad_norms"].keys(), (
        f"{label}: parameters differ: {sorted(set(o_grads) ^ set(s_grads))}")
    problems = []
    for step, (a, b) in enumerate(zip(o["losses"], s["losses"])):
        if not math.isclose(a, b, rel_tol=LOSS_RTOL):
            problems.append(f"step {step} loss {a:.6f} vs single {b:.6f} "
                            f"(rel err {abs(a - b) / abs(b):.3g} > {LOSS_RTOL})")
    worst = (0.0, "")
    for name, g_single in s_grads.items():
        a, b = o["grad_norms"][name], s["grad_norms"][name]
        if not math.isclose(a, b, rel_tol=GRAD_NORM_RTOL):
            problems.append(f"{name}: grad norm {a:.6g} vs single {b:.6g} (rtol {GRAD_NORM_RTOL})")
        g = o_grads[name]
        if g.shape != g_single.shape:
            problems.append(f"{name}: gradient shape {tuple(g.shape)} vs {tuple(g_single.shape)}")
            continue
        rel = ((g - g_single).norm() / g_single.norm().clamp_min(1e-30)).item()
        worst = max(worst, (rel, name))
        if not rel <= GRAD_REL_ERR:
            problems.append(f"{name}: gradient relative L2 error {rel:.3g} > {GRAD_REL_ERR}")
    assert not problems, (
        f"{label} vs single (worst gradient error {worst[0]:.3g} in {worst[1]}):\n"
        + "\n".join(problems))


@pytest.fixture(scope="module")
def gpu_single_run(tmp_path_factory):
    return run_step("single", "cuda", tmp_path_factory.mktemp("single-gpu"))


@requires_two_gpus
@pytest.mark.parametrize("mode", ["ddp", "fsdp2"])
def test_distributed_matches_single_gpu(mode, gpu_single_run, tmp_path):
    """bf16 activations, fp32 parameters, config `small` (seq_len 333, 2 blocks of gqa attention),
    3 AdamW steps; each rank half the batch."""
    compare_runs(gpu_single_run, run_step(mode, "cuda", tmp_path))


CPU_ARGS = ("--config", "tiny")


@pytest.fixture(scope="module")
def cpu_single_run(tmp_path_factory):
    return run_step("single", "cpu", tmp_path_factory.mktemp("single-cpu"), CPU_ARGS)


# One xdist worker for both modes: the single run (a module fixture) is made once.
@pytest.mark.xdist_group("two_gpus_cpu")
@pytest.mark.parametrize("mode", ["ddp", "fsdp2"])
def test_distributed_on_cpu_matches_single(mode, cpu_single_run, tmp_path):
    """The script's CPU path (gloo; the generated ops run their reference on CPU tensors): ddp
    and fsdp2 on 2 processes against the single process, config `tiny`. ~10 s a run on 2 cores."""
    compare_runs(cpu_single_run, run_step(mode, "cpu", tmp_path, CPU_ARGS))
