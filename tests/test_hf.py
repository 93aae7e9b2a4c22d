"""hf.py, the Hugging Face transformers hookup of the attention packages, on the CPU.

A CPU tensor runs the package's reference, so these tests prove the argument mapping (layout,
softmax scale, causal, window, sinks, GQA, the output's dim order) and the refusals, not the
kernels: the generated test_hf_model_matches_eager runs the same comparison on CUDA. They build
tiny random-init models from a config (no download) with the generated tests' own helpers, and
skip without transformers (not in the `test` extra: a large dependency for one module; `pip install -e ".[hf]"`).
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys

import pytest
import torch

from conftest import REPO_ROOT, TESTS_DIR, import_generated

# Every attention package: the shipped ones, and the golden one whose only layout is bhsd.
PACKAGES = ["attention", "attention_sink", "gqa", "attention_recompute"]
GOLDEN = {"attention_recompute"}


def package_module(package: str, module: str):
    """<package>.<module>: of generated/, or of tests/golden/ as golden.<package> (tests/ is on
    sys.path; the golden package itself must not be: its name would then shadow a module, which
    the spec checks of other tests refuse)."""
    if package not in GOLDEN:
        return import_generated(package, module)
    return importlib.import_module(f"golden.{package}.{module}")


def generated_tests(package: str):
    """The package's generated test module: hf_model, hf_run, check_hf_model_matches_eager."""
    pytest.importorskip("transformers", reason="the hf.py tests build a transformers model")
    return package_module(package, f"test_{package}")


def reference(package: str):
    return getattr(package_module(package, "reference"), f"{package}_reference")


def import_hf_alone(package: str) -> subprocess.CompletedProcess:
    """Import <package>.hf in a fresh process; it fails if that imported transformers."""
    path, name = (TESTS_DIR, f"golden.{package}") if package in GOLDEN else (REPO_ROOT, f"generated.{package}")
    code = f"import sys; import {name}.hf; assert 'transformers' not in sys.modules, 'imported'"
    return subprocess.run([sys.executable, "-c", code], cwd=path, capture_output=True, text=True,
                          timeout=300)


# Every package's hf.py imported in turn in one fresh process (Python, torch and TileLang start
# once, not once a package): {package: "ok"} when its import left transformers unimported.
IMPORT_ALL = """
import importlib, json, sys
sys.path.append(sys.argv[1])  # tests/: the golden packages, as golden.<package>
found = {}
for package, module in zip(sys.argv[2::2], sys.argv[3::2]):
    if "transformers" in sys.modules:  # an earlier import took it: this one is judged alone
        break
    try:
        importlib.import_module(module)
    except BaseException as exc:
        found[package] = repr(exc)
        break
    found[package] = "imported" if "transformers" in sys.modules else "ok"
print(json.dumps(found))
"""


@pytest.fixture(scope="module")
def hf_imports() -> dict[str, str]:
    """{package: "ok"} for each package whose hf.py imported without transformers in the shared
    process of IMPORT_ALL (any other outcome, or none, sends the test to a process of its own)."""
    modules = [f"golden.{p}.hf" if p in GOLDEN else f"generated.{p}.hf" for p in PACKAGES]
    result = subprocess.run(
        [sys.executable, "-c", IMPORT_ALL, str(TESTS_DIR),
         *[arg for pair in zip(PACKAGES, modules) for arg in pair]],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    try:
        return json.loads(result.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return {}


# One xdist worker for these: hf_imports runs once.
@pytest.mark.xdist_group("hf_imports")
@pytest.mark.parametrize("package", PACKAGES)
def test_importing_hf_imports_no_transformers(package, hf_imports):
    """transformers is imported by register() only: a model repo without it imports the package."""
    if hf_imports.get(package) == "ok":
        return  # imported with transformers absent before and after: the import did not take it
    result = import_hf_alone(package)
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.mark.parametrize("package", PACKAGES)
def test_register_adds_the_attention_and_its_mask(package):
    tests = generated_tests(package)
    from transformers import AttentionInterface, AttentionMaskInterface

    assert tests.hf.register() == tests.hf.NAME == f"opgen_{package}"
    assert tests.hf.register("my_attention") == "my_attention"
    for name in (tests.hf.NAME, "my_attention"):
        assert AttentionInterface._global_mapping[name] is tests.hf.attention_forward
        assert AttentionMaskInterface._global_mapping[name] is tests.hf.mask


def max_errors(got, want):
    """{name: (max |got - want|, max |want|)} over the loss and every parameter gradient."""
    assert got.keys() == want.keys()
    return {n: ((got[n] - w).abs().max().item(), w.abs().max().item()) for n, w in want.items()}


@pytest.mark.parametrize("package", PACKAGES)
def test_float32_model_equals_eager(package, monkeypatch):
    """The model in float32 with the op replaced by its reference (same signature; it takes
    float32, the op does not): the loss and every parameter gradient equal eager attention's to
    float32 rounding. Any slip in the mapping (layout, scale, window, sinks, kv heads) fails."""
    tests = generated_tests(package)
    monkeypatch.setattr(tests.hf, "op", reference(package))
    model, ids = tests.hf_model("cpu")
    eager = tests.hf_run(model, ids, "eager")
    opgen = tests.hf_run(model, ids, tests.hf.NAME)
    far = {n: e for n, e in max_errors(opgen, eager).items() if e[0] > 1e-5 * e[1]}
    assert not far, f"max error, max |eager| beyond 1e-5 relative: {far}"


@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
@pytest.mark.parametrize("package", PACKAGES)
def test_gpu_comparison_passes_on_the_cpu(package, precision):
    """The generated GPU test's comparison (opgen's errors against the exact run within twice
    eager's), run on the CPU: the op's reference on 16-bit inputs passes it."""
    generated_tests(package).check_hf_model_matches_eager("cpu", precision)


def broken(op, how):
    """op with one argument of transformers' call mapped wrongly."""

    def call(q, k, v, *rest, **kwargs):
        if how == "scale":
            kwargs["softmax_scale"] = None
        elif how == "kv_heads":  # the dim the layout keeps heads in, reversed
            dim = 2 if kwargs["layout"] == "bshd" else 1
            k, v = k.flip(dim), v.flip(dim)
        elif how == "window":
            kwargs["window"] = None
        elif how == "sinks":
            rest = (torch.zeros_like(rest[0]),)
        return op(q, k, v, *rest, **kwargs)

    return call


def broken_cases():
    for package in PACKAGES:
        sinks = package == "attention_sink"
        for how in ("scale", "kv_heads", *(("window", "sinks") if sinks else ())):
            yield pytest.param(package, how, id=f"{package}-{how}")


@pytest.mark.parametrize("package, how", list(broken_cases()))
def test_gpu_comparison_catches_a_broken_mapping(package, how, monkeypatch):
    """The GPU test's tolerance is tight enough: with one argument mapped wrongly (the scale
    dropped, KV heads swapped, the window dropped, the sinks zeroed) it fails."""
    tests = generated_tests(package)
    monkeypatch.setattr(tests.hf, "op", broken(tests.hf.op, how))
    with pytest.raises(AssertionError, match="values"):
        tests.check_hf_model_matches_eager("cpu", str(tests.HF_DTYPE).removeprefix("torch."))


def model_in_16_bits(package):
    tests = generated_tests(package)
    model, ids = tests.hf_model("cpu")
    model.to(tests.HF_DTYPE).set_attn_implementation(tests.hf.NAME)
    return tests, model, ids


@pytest.mark.parametrize("package", PACKAGES)
def test_a_mask_without_padding_is_taken(package):
    tests, model, ids = model_in_16_bits(package)
    with torch.no_grad():
        plain = model(input_ids=ids).logits
        ones = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
    assert torch.equal(plain, ones)


@pytest.mark.parametrize("package", PACKAGES)
def test_refuses_what_the_op_cannot_do(package):
    """Each with a ValueError naming the argument, before the op runs."""
    tests, model, ids = model_in_16_bits(package)
    from transformers import GptOssForCausalLM

    padded = torch.ones_like(ids)
    padded[0, -3:] = 0
    with torch.no_grad():
        with pytest.raises(ValueError, match="attention_mask: padding"):
            model(input_ids=ids, attention_mask=padded)
        by_hand = torch.zeros(ids.shape[0], 1, ids.shape[1], ids.shape[1], dtype=tests.HF_DTYPE)
        with pytest.raises(ValueError, match="attention_mask: got a tensor of shape"):
            model(input_ids=ids, attention_mask=by_hand)
        # Packed sequences (position_ids that restart). gpt-oss builds its masks without
        # position_ids: no packed-sequence mask there, for eager attention either.
        if not isinstance(model, GptOssForCausalLM):
            restarts = torch.arange(ids.shape[1]).remainder(50).expand(ids.shape[0], -1)
            with pytest.raises(ValueError, match="attention_mask: not the plain causal"):
                model(input_ids=ids, position_ids=restarts, use_cache=False)
        cache = model(input_ids=ids, use_cache=True).past_key_values
        with pytest.raises(ValueError, match="attention_mask: .*KV cache"):
            model(input_ids=ids[:, -1:], past_key_values=cache, use_cache=True)
        with pytest.raises(ValueError, match="output_attentions"):
            model(input_ids=ids, output_attentions=True)
    model.config.attention_dropout = 0.1
    for layer in model.model.layers:
        layer.self_attn.attention_dropout = 0.1
    model.train()
    with pytest.raises(ValueError, match="dropout"):
        model(input_ids=ids)
    model.eval()  # dropout is off outside training: taken
    with torch.no_grad():
        model(input_ids=ids)


@pytest.mark.parametrize("package", PACKAGES)
def test_refuses_float32_outside_autocast(package):
    tests = generated_tests(package)
    model, ids = tests.hf_model("cpu")
    model.set_attn_implementation(tests.hf.register())
    with torch.no_grad(), pytest.raises(TypeError, match="dtype torch.float32"):
        model(input_ids=ids)


@pytest.mark.parametrize("package", PACKAGES)
def test_refuses_arguments_the_package_lacks(package):
    """s_aux for a package without sinks (and none for one with them), a sliding_window for one
    without a window, and a KV length other than the query's (a cache)."""
    tests = generated_tests(package)
    hf = tests.hf
    module = torch.nn.Module()
    module.is_causal = True
    q = torch.randn(1, 4, 8, 64, dtype=tests.HF_DTYPE)
    kv = torch.randn(1, 4, 8, 64, dtype=tests.HF_DTYPE)
    sinks = torch.zeros(4)
    has_sinks = package == "attention_sink"
    if has_sinks:
        with pytest.raises(ValueError, match="s_aux: the model passes no sinks"):
            hf.attention_forward(module, q, kv, kv, None)
        out, weights = hf.attention_forward(module, q, kv, kv, None, s_aux=sinks, sliding_window=3)
        assert out.shape == (1, 8, 4, 64) and weights is None
    else:
        with pytest.raises(ValueError, match="s_aux: .* has no sinks"):
            hf.attention_forward(module, q, kv, kv, None, s_aux=sinks)
        with pytest.raises(ValueError, match="sliding_window: .* has no sliding window"):
            hf.attention_forward(module, q, kv, kv, None, sliding_window=3)
    with pytest.raises(ValueError, match="key: 7 keys for 8 queries"):
        hf.attention_forward(module, q, kv[:, :, :7], kv[:, :, :7], None,
                             s_aux=sinks if has_sinks else None)
    with pytest.raises(ValueError, match="softcap"):
        hf.attention_forward(module, q, kv, kv, None, softcap=30.0,
                             s_aux=sinks if has_sinks else None)
