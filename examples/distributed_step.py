"""Three training steps of a small decoder built from the generated modules, on one device, under
DistributedDataParallel or under FSDP2 (torch.distributed.fsdp.fully_shard); the per-step losses
and the first step's per-parameter gradient norms go to a JSON file, so that the runs can be
compared (tests/test_two_gpus.py does).

    python examples/distributed_step.py --mode single --out single.json
    torchrun --standalone --nproc-per-node 2 examples/distributed_step.py --mode ddp --out ddp.json
    torchrun --standalone --nproc-per-node 2 examples/distributed_step.py --mode fsdp2 --out f.json
    # CPU smoke check (gloo; the generated ops run their PyTorch reference on CPU tensors):
    python examples/distributed_step.py --device cpu --config tiny --mode single --out s.json
    torchrun --standalone --nproc-per-node 2 examples/distributed_step.py --device cpu \\
        --config tiny --mode ddp --out d.json

The model (plain PyTorch around the generated modules): an embedding; per block RMSNorm ->
q, k, v projections (generated.matmul.Linear) -> causal attention (generated.gqa.Attention, or
generated.attention.Attention with --attention attention) -> o projection -> residual, RMSNorm ->
gate, up (Linear) -> generated.swiglu.SwiGLU -> down (Linear) -> residual; a final RMSNorm and a
Linear head; cross-entropy in fp32. Parameters are fp32 (the optimizer's master weights); the
activations run in --dtype (bf16 by default): every generated module casts its parameters to its
input's dtype through a differentiable cast, so the gradients arrive in fp32.

Every mode builds the same model from --seed and draws the same batch of --batch random
sequences, which every step trains on (AdamW, --lr). `single` trains on the whole batch on
cuda:0 (or the CPU); `ddp` and `fsdp2` give each of the WORLD_SIZE ranks an equal slice of it,
rank r on cuda:LOCAL_RANK (the loss is a mean over equal token counts, so the averaged gradients
equal the whole batch's). `fsdp2` calls fully_shard on every block, then on the root.
The losses written are the whole batch's (the ranks' means averaged); the gradients are the
whole model's after the first backward, before the first optimizer step (FSDP2's sharded DTensor
gradients are gathered with .full_tensor()). --grads PATH also saves those gradients (fp32, CPU)
with torch.save, for an element-wise comparison.
"""

import argparse
import datetime
import gc
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # the repository root: `generated` is importable

from generated.matmul import Linear  # noqa: E402
from generated.rmsnorm import RMSNorm  # noqa: E402
from generated.swiglu import SwiGLU  # noqa: E402

# Shapes the generated packages take: head_dim 64 (gqa and attention take 64 or 128), matmul K and
# N multiples of 8 (16-byte rows), odd seq_len and an intermediate size off every block multiple
# (tail tiles); batch divisible by 2 ranks. "tiny" is for the CPU (the reference is plain torch).
CONFIGS = {
    "small": dict(vocab=512, hidden=256, heads=4, kv_heads=2, head_dim=64, intermediate=680,
                  layers=2, batch=4, seq_len=333),
    "tiny": dict(vocab=128, hidden=128, heads=2, kv_heads=1, head_dim=64, intermediate=200,
                 layers=2, batch=4, seq_len=33),
}
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}


def attention_module(kind, cfg):
    if kind == "gqa":
        from generated.gqa import Attention

        return Attention(causal=True, layout="bshd")
    from generated.attention import Attention

    if cfg["kv_heads"] != cfg["heads"]:
        raise SystemExit("distributed_step: --attention attention needs kv_heads == heads "
                         "(use --kv-heads or --attention gqa)")
    return Attention(causal=True, layout="bshd")


class Block(nn.Module):
    def __init__(self, cfg, attention):
        super().__init__()
        h, d = cfg["hidden"], cfg["head_dim"]
        self.heads, self.kv_heads, self.head_dim = cfg["heads"], cfg["kv_heads"], d
        self.attn_norm, self.mlp_norm = RMSNorm(h), RMSNorm(h)
        self.q = Linear(h, self.heads * d)
        self.k = Linear(h, self.kv_heads * d)
        self.v = Linear(h, self.kv_heads * d)
        self.attn = attention_module(attention, cfg)
        self.o = Linear(self.heads * d, h)
        self.gate = Linear(h, cfg["intermediate"])
        self.up = Linear(h, cfg["intermediate"])
        self.act = SwiGLU()
        self.down = Linear(cfg["intermediate"], h)

    def forward(self, x):
        batch, seq_len, _ = x.shape
        y = self.attn_norm(x)
        # Linear outputs are contiguous: these views are the dense bshd tensors attention takes.
        q = self.q(y).view(batch, seq_len, self.heads, self.head_dim)
        k = self.k(y).view(batch, seq_len, self.kv_heads, self.head_dim)
        v = self.v(y).view(batch, seq_len, self.kv_heads, self.head_dim)
        x = x + self.o(self.attn(q, k, v).reshape(batch, seq_len, -1))
        y = self.mlp_norm(x)
        return x + self.down(self.act(self.gate(y), self.up(y)))


class Decoder(nn.Module):
    def __init__(self, cfg, attention, compute_dtype):
        super().__init__()
        self.compute_dtype = compute_dtype
        self.embed = nn.Embedding(cfg["vocab"], cfg["hidden"])
        self.layers = nn.ModuleList(Block(cfg, attention) for _ in range(cfg["layers"]))
        self.norm = RMSNorm(cfg["hidden"])
        self.head = Linear(cfg["hidden"], cfg["vocab"])

    def forward(self, tokens):
        x = self.embed(tokens).to(self.compute_dtype)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))


def loss_of(logits, targets):
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


def fixed_batch(cfg, seed):
    """[batch, seq_len + 1] random tokens, the same in every mode and on every rank; every step
    trains on it (the loss falls: the model memorises it)."""
    g = torch.Generator().manual_seed(seed + 1)
    return torch.randint(0, cfg["vocab"], (cfg["batch"], cfg["seq_len"] + 1), generator=g)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", choices=["single", "ddp", "fsdp2"], required=True)
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--config", choices=sorted(CONFIGS), default="small")
    p.add_argument("--attention", choices=["gqa", "attention"], default="gqa")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16",
                   help="activation (compute) dtype; parameters stay fp32")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    for key in ("batch", "seq_len", "layers", "kv_heads"):
        p.add_argument(f"--{key.replace('_', '-')}", type=int, default=None,
                       help=f"override the config's {key}")
    p.add_argument("--out", type=Path, required=True, help="JSON file (written by rank 0)")
    p.add_argument("--grads", type=Path, default=None,
                   help="also torch.save the first step's full fp32 gradients here (rank 0)")
    return p.parse_args(argv)


def setup(args):
    """(device, rank, world_size); initialises the process group for ddp and fsdp2."""
    if args.mode == "single":
        if "WORLD_SIZE" in os.environ and int(os.environ["WORLD_SIZE"]) > 1:
            raise SystemExit("distributed_step: --mode single runs in one process, "
                             "not under torchrun")
        device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
        if device.type == "cuda":
            torch.cuda.set_device(device)
        return device, 0, 1
    if "RANK" not in os.environ:
        raise SystemExit(f"distributed_step: --mode {args.mode} runs under torchrun (torchrun "
                         "--standalone --nproc-per-node 2 examples/distributed_step.py ...)")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    timeout = datetime.timedelta(minutes=10)  # the first step compiles TileLang kernels
    if args.device == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", rank=rank, world_size=world, timeout=timeout,
                                device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timeout)
    return device, rank, world


def wrap(model, args, device, world):
    if args.mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        return DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    if args.mode == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh(device.type, (world,))
        for layer in model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    return model


def full_gradients(model):
    """{name: fp32 gradient of the whole parameter}; the same collective calls on every rank."""
    grads = {}
    for name, param in model.named_parameters():
        g = param.grad
        if g is None:
            raise RuntimeError(f"distributed_step: {name} got no gradient")
        if hasattr(g, "full_tensor"):  # an FSDP2 DTensor shard
            g = g.full_tensor()
        grads[name.removeprefix("module.")] = g.detach().float()
    return grads


def train(args, cfg, device, rank, world):
    """--steps steps; returns (whole-batch losses, first-step gradient norms, step seconds). The
    model, its DDP reducer or FSDP2 state and the optimizer live only in here, so they are freed
    before main destroys the process group."""
    dtype = DTYPES[args.dtype]
    torch.manual_seed(args.seed)
    model = Decoder(cfg, args.attention, dtype).to(device)  # fp32 parameters, drawn on the CPU
    model = wrap(model, args, device, world)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    per_rank = cfg["batch"] // world
    tokens = fixed_batch(cfg, args.seed)[rank * per_rank:(rank + 1) * per_rank].to(device)

    losses, norms, times = [], {}, []
    for step in range(args.steps):
        start = time.perf_counter()
        loss = loss_of(model(tokens[:, :-1]), tokens[:, 1:])
        loss.backward()
        if step == 0:
            grads = full_gradients(model)
            norms = {name: g.norm().item() for name, g in grads.items()}
            if args.grads is not None and rank == 0:
                torch.save({name: g.cpu() for name, g in grads.items()}, args.grads)
            del grads
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        whole = loss.detach().clone()
        if world > 1:
            dist.all_reduce(whole)  # SUM (gloo has no AVG): the ranks' means, averaged below
            whole /= world
        losses.append(whole.item())
        times.append(time.perf_counter() - start)
    return losses, norms, times


def main(argv=None):
    args = parse_args(argv)
    cfg = dict(CONFIGS[args.config])
    for key in ("batch", "seq_len", "layers", "kv_heads"):
        if getattr(args, key) is not None:
            cfg[key] = getattr(args, key)
    device, rank, world = setup(args)
    if cfg["batch"] % world:
        raise SystemExit(f"distributed_step: batch {cfg['batch']} is not divisible by "
                         f"{world} ranks")

    losses, norms, times = train(args, cfg, device, rank, world)

    if rank == 0:
        result = dict(
            mode=args.mode, device=args.device, world_size=world, config=cfg,
            attention=args.attention, dtype=args.dtype, steps=args.steps, lr=args.lr,
            seed=args.seed, torch=torch.__version__, losses=losses, grad_norms=norms,
            step_seconds=times,
        )
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        print(f"{args.mode} ({world} x {device.type}): losses "
              + ", ".join(f"{x:.5f}" for x in losses) + f" -> {args.out}")
    if world > 1:
        # The DDP reducer holds the process group; left to interpreter exit, gloo's worker
        # threads could be torn down after Python is (an abort after the results were written,
        # seen once in CI). Collect it now, then destroy the group while everything is alive.
        gc.collect()
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
