"""`opgen explain`: a --shape value the user gives is the one explained (or refused), never
replaced by a default."""

from __future__ import annotations

from conftest import REPO_ROOT, write_spec

GQA = (
    'name = "x"\nfamily = "attention"\n[attention]\ngqa = true\n'
    "[test]\nshapes = [{batch=1, heads=8, kv_heads=2, seq_len=333}]\n"
)
SHAPE = "batch=1,heads=8,seq_len=128,head_dim=64"


def test_kv_heads_zero_is_refused(project, cli):
    write_spec(project, GQA)
    result = cli("explain", "specs/x.toml", "--shape", SHAPE + ",kv_heads=0")
    assert result.exit_code == 2, result.output
    assert result.stderr == "--shape: kv_heads must be >= 1 (got 0)\n"


def test_kv_heads_given_is_used(project, cli):
    write_spec(project, GQA)
    result = cli("explain", "specs/x.toml", "--shape", SHAPE + ",kv_heads=2")
    assert result.exit_code == 0, result.output
    assert "heads=8 kv_heads=2 " in result.stdout and "(groups=4)" in result.stdout


def test_kv_heads_left_out_is_heads(project, cli):
    write_spec(project, GQA)
    result = cli("explain", "specs/x.toml", "--shape", SHAPE)
    assert result.exit_code == 0, result.output
    assert "heads=8 kv_heads=8 " in result.stdout and "(groups=1)" in result.stdout


def test_default_shape_is_the_first_bench_shape(project, cli):
    write_spec(project, 'name = "x"\nfamily = "attention"\n')
    result = cli("explain", "specs/x.toml")
    assert result.exit_code == 0, result.output
    assert "shape: batch=4 heads=16 kv_heads=16 seq_len=4096 head_dim=128" in result.stdout


def test_spec_without_bench_shapes_is_refused_before_explaining(project, cli):
    write_spec(project, 'name = "x"\nfamily = "attention"\n[bench]\nshapes = []\n')
    result = cli("explain", "specs/x.toml")
    assert result.exit_code == 2, result.output
    assert result.stderr == "specs/x.toml: bench.shapes: must list at least one shape\n"



def test_short_causal_grid_is_paired(project):
    """Causal grids of at most PAIRED_MAX_QUERY_BLOCKS query blocks pair them, as the package's
    CallPlan does: half the blocks (rounded up). Longer or non-causal grids do not."""
    from pathlib import Path

    from opgen.families import attention
    from opgen.render import load_plan

    write_spec(project, GQA)
    plan, _ = load_plan(Path("specs/x.toml"))
    block_m = plan.tiling_for("fwd", 64, True)["block_m"]
    grids = {}
    for seq_len, causal in ((7 * block_m + 1, True), (7 * block_m + 1, False), (33 * block_m, True)):
        shape = dict(batch=2, heads=8, kv_heads=2, seq_len=seq_len, head_dim=64, causal=causal)
        rows = dict(attention.explain(plan, shape))["kernels"]
        row = next(row for row in rows if row[0] == "x_fwd")
        grids[seq_len // block_m, causal] = row[2].rsplit(" = ", 1)[1]
    # Unpaired causal: heads fastest (launch_grid).
    assert grids == {(7, True): "(4, 8, 2)", (7, False): "(8, 8, 2)", (33, True): "(8, 33, 2)"}


def test_tiling_column_is_what_the_shape_launches():
    """The kernels table shows the tiling each kernel launches with at the shape: the spec's
    [[tiling.tuned]] entry of its (head_dim, causal), the paired forward's where the grid pairs."""
    from opgen.families import attention
    from opgen.render import load_plan

    plan, _ = load_plan(REPO_ROOT / "specs/gqa.toml")

    def tilings(**shape):
        shape = dict(batch=2, heads=32, kv_heads=8, **shape)
        rows = dict(attention.explain(plan, shape))["kernels"]
        return {row[1]: row[3] for row in rows}

    full64 = tilings(seq_len=4096, head_dim=64, causal=False)
    assert full64["fwd"] == ", ".join(f"{k}={v}" for k, v in plan.tiling_for("fwd", 64, False).items())
    assert "block_m=192" in full64["fwd"]  # three consumer warpgroups (specs/gqa.toml's entry)
    assert full64["bwd"] == ", ".join(f"{k}={v}" for k, v in plan.tiling_for("bwd", 64, False).items())
    long_causal = tilings(seq_len=4096, head_dim=128, causal=True)
    assert long_causal["fwd"] == ", ".join(
        f"{k}={v}" for k, v in plan.tiling_for("fwd", 128, True).items())
    short_causal = tilings(seq_len=1000, head_dim=128, causal=True)
    assert short_causal["fwd"].endswith("pair_blocks=True") and "overlap" not in short_causal["fwd"]


def test_short_window_grid_walks_heads():
    """At a window so short that a query block sees at most two key blocks, a forward block walks
    several query heads, as many as still leave blocks for 7/8 of the block slots (132 SMs
    assumed, an H200, times the tiling's blocks_per_sm): the package's rule
    (attention_launch.heads_per_block), with the GPU's SM count at run time."""
    from opgen.families import attention
    from opgen.render import load_plan

    plan, _ = load_plan(REPO_ROOT / "specs/attention_sink.toml")
    # The grids below assume these: 128 x 128 blocks past a window of 128, 64 x 64 up to it.
    assert [(t["block_m"], t["block_n"]) for t in (plan.tiling_for("fwd", 64, True, 129),
                                                  plan.tiling_for("fwd", 64, True, 128))] == [
        (128, 128), (64, 64)]
    grids = {}
    for batch, seq_len, window in ((1, 128, 129), (2, 1000, 129), (2, 1000, 1024), (2, 1000, 128),
                                   (8, 4096, 16), (1, 1000, 16)):
        shape = dict(batch=batch, heads=64, kv_heads=8, seq_len=seq_len, head_dim=64, causal=True,
                     window=window)
        rows = dict(attention.explain(plan, shape))["kernels"]
        row = next(row for row in rows if row[0].endswith("_fwd"))
        grids[batch, seq_len, window] = row[2].rsplit(" = ", 1)[1]
    assert grids == {
        (1, 128, 129): "(1, 64, 1)",  # one query block: walking heads would leave SMs idle
        (2, 1000, 129): "(8, 8, 2)",  # 16 query blocks: 8 heads a block, 128 blocks
        # A long window: one head a block, the plain forward's causal grid (heads fastest).
        (2, 1000, 1024): "(64, 8, 2)",
        (2, 1000, 128): "(64, 16, 2)",  # 64 x 64 blocks see three key blocks: as above
        (8, 4096, 16): "(64, 8, 8)",  # 64 x 64 blocks that see two: 8 heads a block
        # Four blocks an SM (528 slots): 4 heads a block would leave 256 blocks, under 7/8 of
        # them (one block an SM would take 8 heads a block).
        (1, 1000, 16): "(16, 32, 1)",
    }


def test_the_packages_hold_the_launch_rules_explain_uses():
    """attention_launch.py's sections are in every attention package's kernels.py, as written."""
    from opgen.families.attention import launch_code

    for name in ("attention", "gqa", "attention_sink"):
        kernels = (REPO_ROOT / "generated" / name / "kernels.py").read_text()
        assert launch_code("paired causal forward") in kernels
        assert launch_code("launch order") in kernels
        assert (launch_code("short windows") in kernels) == (name == "attention_sink")


def test_causal_grids_run_heads_fastest():
    """The forward and backward grids, as `opgen explain` shows them and the kernels launch them:
    causal, heads fastest (every head's longest block launches first); full, blocks fastest (the
    blocks running at once share a few heads' data in L2). In_block dK/dV: one backward block per
    KV head."""
    from opgen.families import attention
    from opgen.render import load_plan

    plan, _ = load_plan(REPO_ROOT / "specs/gqa.toml")
    grids, blocks = {}, {}
    for causal in (True, False):
        shape = dict(batch=2, heads=32, kv_heads=8, seq_len=4096, head_dim=128, causal=causal)
        rows = dict(attention.explain(plan, shape))["kernels"]
        for phase in ("fwd", "bwd"):
            row = next(row for row in rows if row[0].endswith(f"_{phase}"))
            grids[phase, causal] = row[2].rsplit(" = ", 1)[1]
            blocks[phase, causal] = 4096 // plan.tiling_for(phase, 128, causal)["block_m"]
    assert grids == {
        ("fwd", True): f"(32, {blocks['fwd', True]}, 2)",
        ("fwd", False): f"({blocks['fwd', False]}, 32, 2)",
        ("bwd", True): f"(8, {blocks['bwd', True]}, 2)",
        ("bwd", False): f"({blocks['bwd', False]}, 8, 2)",
    }
