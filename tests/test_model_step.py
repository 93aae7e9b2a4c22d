"""examples/model_step.py on the CPU: the GPT-OSS-style baseline computes the attention the
attention_sink package computes, and both architectures' baseline steps run."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest
import torch

from conftest import REPO_ROOT, import_generated

SCRIPT = REPO_ROOT / "examples" / "model_step.py"


@pytest.fixture(scope="module")
def model_step():
    spec = importlib.util.spec_from_file_location("model_step", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("window", [None, 5])
def test_eager_sinks_baseline_is_the_package_s_attention(model_step, window):
    """The baseline's eager formula (transformers' for GPT-OSS) against attention_sink's CPU path
    (its float32 reference), GQA 4 / 2 heads, odd length, sinks that take visible mass."""
    attention_sink = import_generated("attention_sink", "autograd").attention_sink
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 19, 4, 64, generator=g).bfloat16()
    k, v = (torch.randn(2, 19, 2, 64, generator=g).bfloat16() for _ in range(2))
    sinks = torch.randn(4, generator=g) * 2
    expected = attention_sink(q, k, v, sinks, causal=True, window=window, layout="bshd")
    got = model_step.eager_sinks_attention(q.float(), k.float(), v.float(), sinks, window)
    torch.testing.assert_close(got, expected.float(), atol=2e-2, rtol=2e-2)
    # The sinks change the output: a baseline that dropped them would fail the comparison.
    without = model_step.eager_sinks_attention(q.float(), k.float(), v.float(), None, window)
    assert (without - expected.float()).abs().max() > 0.1


@pytest.mark.parametrize("window", [None, 7])
def test_flex_folds_the_sinks_in_as_the_eager_formula_does(model_step, monkeypatch, window):
    """FlexAttention's output rescaled by sigmoid(lse - sink) is the eager formula's. On the CPU
    FlexAttention runs uncompiled (its compiled CPU path has no lse), forward only."""
    monkeypatch.setattr(torch, "compile", lambda fn, **options: fn)
    g = torch.Generator().manual_seed(1)
    q = torch.randn(1, 40, 4, 64, generator=g)
    k, v = (torch.randn(1, 40, 2, 64, generator=g) for _ in range(2))
    sinks = torch.randn(4, generator=g) * 2
    flex = model_step.flex_attention_op()
    torch.testing.assert_close(flex(q, k, v, sinks, window),
                               model_step.eager_sinks_attention(q, k, v, sinks, window))
    torch.testing.assert_close(flex(q, k, v, None, window),
                               model_step.eager_sinks_attention(q, k, v, None, window))


def test_windows_alternate_and_sinks_are_parameters(model_step):
    cfg = model_step.CONFIGS["gpt-oss", True]
    ops = model_step.baseline_ops(cfg, "default")
    model = model_step.build(cfg, ops, torch.device("cpu"), torch.float32, seed=0)
    assert [layer.window for layer in model.layers] == [cfg["window"], None]
    assert all(layer.sinks.shape == (cfg["heads"],) for layer in model.layers)
    inputs, targets = model_step.batch_of(cfg, 2, 33, torch.device("cpu"), seed=0)
    model(inputs, targets).backward()
    assert all(layer.sinks.grad.abs().sum() > 0 for layer in model.layers)


@pytest.mark.parametrize("arch", ["llama", "gpt-oss"])
def test_cpu_smoke_run(arch):
    run = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--impl", "baseline",
                          "--tiny", "--arch", arch, "--seq-lens", "32"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "baseline" in run.stdout.splitlines()[-1]


def test_gpu_impls_refuse_the_cpu_with_one_line():
    run = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--impl", "flex",
                          "--tiny", "--arch", "gpt-oss"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 1
    assert "--impl flex needs a CUDA GPU" in run.stderr
    assert "Traceback" not in run.stderr


def test_hf_step_without_a_gpu_says_so_in_one_line():
    run = subprocess.run([sys.executable, str(REPO_ROOT / "examples" / "hf_step.py")],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 1
    assert run.stderr.strip() == "hf_step: needs a CUDA GPU"
