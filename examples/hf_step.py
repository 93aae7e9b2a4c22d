"""A training step of a small GPT-OSS model built by transformers (random weights, no download)
under each attention implementation: transformers' `eager` (what a GPT-OSS model runs by default),
`flex_attention` where transformers offers it for the model, and `opgen_attention_sink`
(generated/attention_sink/hf.py, registered by `hf.register()`).

    python examples/hf_step.py                              # S = 1000 and 2048, B = 2
    python examples/hf_step.py --seq-lens 4096 --batch 1 --json results.json

One model, built once from a seed; each implementation gets the same tokens, a fresh AdamW and
the model as the previous one left it (the weights only move by a few optimizer steps). A step
is forward + loss + backward + AdamW step + zero_grad. Needs a CUDA GPU and transformers.
"""

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

from model_step import time_steps  # this script's folder is on sys.path


def build_model(args):
    import transformers

    config = transformers.GptOssConfig(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        head_dim=64,
        max_position_embeddings=max(args.seq_lens),
        # GPT-OSS: a 128-key window on every other layer, full causal attention on the others.
        sliding_window=128,
        layer_types=["sliding_attention", "full_attention"] * (args.layers // 2),
        num_local_experts=args.experts,
        num_experts_per_tok=args.top_k,
        rope_parameters={"rope_type": "default", "rope_theta": 150000.0},
        tie_word_embeddings=False,
        experts_implementation=args.experts_implementation,
    )
    torch.manual_seed(args.seed)
    model = transformers.GptOssForCausalLM(config)
    for layer in model.model.layers:
        # Sinks near 2 (initialized near 0, where they hardly matter): each takes a visible share
        # of its rows, so an implementation that dropped them would show in the loss check.
        torch.nn.init.normal_(layer.self_attn.sinks, mean=2.0)
    return model.to(device="cuda", dtype=torch.bfloat16)


def first_losses(model, names, ids):
    """{name: loss} of one forward under each implementation, with no optimizer step between them:
    the same weights, so the losses agree up to bf16 rounding where the implementations compute
    the same attention (sinks and windows included). None where the implementation fails."""
    losses = {}
    with torch.no_grad():
        for name, implementation in names.items():
            try:
                model.set_attn_implementation(implementation)
                losses[name] = model(input_ids=ids, labels=ids).loss.item()
            except Exception:  # reported, with its error, when its steps are timed
                losses[name] = None
    return losses


def measure(model, implementation, ids, args):
    """{first_step_s, step_ms (median), peak_gib} of training steps under the implementation."""
    model.set_attn_implementation(implementation)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)

    def step():
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    first_s, times, peak = time_steps(step, torch.device("cuda"), args.warmup, args.steps)
    return dict(first_step_s=first_s, step_ms=statistics.median(times), peak_gib=peak)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seq-lens", type=int, nargs="+", default=[1000, 2048])
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--layers", type=int, default=4, help="even: sliding and full layers alternate")
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--intermediate", type=int, default=2048, help="each expert's")
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--experts", type=int, default=4)
    p.add_argument("--top-k", type=int, default=2)
    p.add_argument("--experts-implementation", default="eager",
                   help="transformers' experts_implementation (the same for every attention)")
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--steps", type=int, default=20, help="timed steps (median)")
    p.add_argument("--warmup", type=int, default=3, help="warm-up steps, the first included")
    p.add_argument("--implementations", nargs="+",
                   default=["eager", "flex_attention", "opgen"],
                   help="transformers attn_implementation names; opgen = generated/attention_sink")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", metavar="PATH", help="also save the results as JSON")
    args = p.parse_args()
    if args.layers % 2:
        sys.exit("hf_step: --layers must be even (sliding and full layers alternate)")
    if not torch.cuda.is_available():
        sys.exit("hf_step: needs a CUDA GPU")
    try:
        import transformers  # noqa: F401
    except ImportError:
        sys.exit("hf_step: needs transformers (pip install transformers)")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: generated/
    from generated.attention_sink import hf

    hf.register()
    names = {name: hf.NAME if name == "opgen" else name for name in args.implementations}

    model = build_model(args)
    print(f"GptOssForCausalLM: {args.layers} layers, hidden {args.hidden}, {args.heads} / "
          f"{args.kv_heads} heads of D64, window 128 on every other layer, {args.experts} experts "
          f"(top {args.top_k}), bf16, batch {args.batch}; {args.steps} steps (median) after "
          f"{args.warmup} warm-up; {torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"transformers {transformers.__version__}")
    print(f"{'seq_len':>7} {'attention':>16} {'first step s':>12} {'step ms':>9} {'peak GiB':>8} "
          f"{'eager / this':>12}")
    results = []
    for seq_len in args.seq_lens:
        g = torch.Generator().manual_seed(args.seed)
        ids = torch.randint(0, args.vocab, (args.batch, seq_len), generator=g).cuda()
        losses = first_losses(model, names, ids)
        reference = losses.get("eager")
        print(f"{seq_len:>7} first-step losses: " + ", ".join(
            f"{name} {loss:.6f}" + (f" (rel diff {abs(loss - reference) / abs(reference):.1e})"
                                    if reference and name != "eager" else "")
            for name, loss in losses.items() if loss is not None))
        eager_ms = None
        for name, implementation in names.items():
            try:
                r = measure(model, implementation, ids, args)
            except Exception as error:  # an implementation transformers lacks for this model
                print(f"{seq_len:>7} {name:>16} n/a: {type(error).__name__}: {error}"[:200])
                results.append(dict(seq_len=seq_len, attention=name, first_loss=losses[name],
                                    error=str(error)))
                continue
            if name == "eager":
                eager_ms = r["step_ms"]
            ratio = f"{eager_ms / r['step_ms']:.3f}x" if eager_ms else ""
            print(f"{seq_len:>7} {name:>16} {r['first_step_s']:>12.2f} {r['step_ms']:>9.2f} "
                  f"{r['peak_gib']:>8.2f} {ratio:>12}")
            results.append(dict(seq_len=seq_len, attention=name, first_loss=losses[name], **r))
    if args.json:
        meta = {k: v for k, v in vars(args).items() if k != "json"}
        meta.update(gpu=torch.cuda.get_device_name(), torch=torch.__version__,
                    transformers=transformers.__version__)
        Path(args.json).write_text(json.dumps(dict(meta=meta, results=results), indent=2) + "\n")


if __name__ == "__main__":
    main()
