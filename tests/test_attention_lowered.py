"""The lowered CUDA of the attention backward's small kernels (TileLang lowering for sm_90a on
the CPU, no nvcc; `opgen build` compiles them): the preprocess zeroes the fp32 atomic targets with
16-byte stores, each guarded by its buffer's rows; the postprocess finishes split dK/dV from
16-byte loads of the partials, summed in a fixed order, with no atomics; the dsinks
kernel's one store per head comes from one thread."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from conftest import import_generated

pytestmark = [pytest.mark.compile, pytest.mark.xdist_group("attention_lowered")]

TILING = {"preprocess": {"block_m": 32, "threads": 128}, "postprocess": {"block_m": 64, "threads": 128},
          "dsinks": {"block_m": 128, "threads": 128}}


def cuda_source(factory, args, tiling) -> str:
    """The kernel's whole CUDA source, lowered as the compile check lowers it (without nvcc): with
    the factory's pass configs and those the kernel carries itself (the factory's win)."""
    import tilelang
    from tvm import transform
    from tvm.target import Target

    target = {"kind": "cuda", "arch": "sm_90a"}
    func = factory.get_tir(*args, **tiling)
    attrs = func.attrs or {}
    own = dict(attrs["tilelang_pass_configs"]) if "tilelang_pass_configs" in attrs else {}
    configs = {**own, **(factory.pass_configs or {})}
    with transform.PassContext(opt_level=3, config=configs), Target(target):
        return tilelang.lower(func, target=target).kernel_source


def lower(factory, args, tiling) -> str:
    """The kernel's CUDA from its launch bounds on (cuda_source without the headers)."""
    source = cuda_source(factory, args, tiling)
    return source[source.index("__launch_bounds__"):]


@pytest.fixture(scope="module")
def lowered():
    sink = import_generated("attention_sink", "kernels")
    gqa = import_generated("gqa", "kernels")
    return {
        "preprocess atomic": lower(sink.attention_sink_bwd_preprocess,
                                   (32, 8, 64, "bshd", "bfloat16", "atomic", "atomic"), TILING["preprocess"]),
        "preprocess split": lower(gqa.gqa_bwd_preprocess,
                                  (32, 8, 128, "bshd", "bfloat16", "split", "split"), TILING["preprocess"]),
        "postprocess split": lower(gqa.gqa_bwd_postprocess,
                                   (32, 8, 128, "bshd", "bfloat16", 0.125, "split", "split"), TILING["postprocess"]),
        "dsinks": lower(sink.attention_sink_bwd_dsinks, (32,), TILING["dsinks"]),
    }


def zero_stores(source, buffer):
    """The guards of the 16-byte zero stores into `buffer`."""
    return re.findall(r"if \(\((.*?)\) < (\w+)\) \{\s*\*\(float4\*\)\(" + buffer + r" \+", source)


def test_preprocess_zeroes_dq_with_vector_stores_over_its_padded_rows(lowered):
    for label in ("preprocess atomic", "preprocess split"):
        stores = zero_stores(lowered[label], "dQ")
        assert stores and all(bound.startswith("padded_rows") for _, bound in stores), (label, stores)


def test_preprocess_zeroes_atomic_dkv_only(lowered):
    atomic = lowered["preprocess atomic"]
    for buffer in ("dK", "dV"):
        stores = zero_stores(atomic, buffer)
        assert stores and all(bound == "seq_len" for _, bound in stores), (buffer, stores)
    # The blocks of the first kv_heads (8) query heads zero them.
    assert "if (((int)blockIdx.y) < 8) {" in atomic
    split = lowered["preprocess split"]
    assert not zero_stores(split, "dK") and not zero_stores(split, "dV")


def partial_sum_order(source, buffer):
    """The partials of `buffer`, as the g of the g * batch + bz row each was loaded from, in the
    order the lowered code adds them (a left fold: ((p_a + p_b) + p_c) + ...)."""
    section = source[source.index(f"float {buffer}_local_cast"):]
    section = section[: section.index(f"*(uint2*)({buffer}_out_local_cast")]
    # Each partial is loaded from batch row g * batch + blockIdx.z, g = 0 first.
    rows = re.findall(r"\*\(float4\*\)\(" + buffer + r" \+ .*?\* \(\(int64_t\)seq_len\)\)", section)
    groups = []
    for row in rows:
        m = re.search(r"\(\(int64_t\)batch\) \* \(int64_t\)(\d+)\)", row)
        groups.append(int(m.group(1)) if m else (1 if "((int64_t)batch) +" in row else 0))
    locals_in_load_order = re.findall(r"\*\(float4\*\)\((\w+_local_cast_\d+) \+ 0\) = ", section)
    group_of = dict(zip(locals_in_load_order, groups))
    alias = dict(re.findall(r"float4 (v_\w*) = \*\(float4\*\)\((\w+) \+ 0\);", section))
    adds = re.findall(r"(\w+)\.x = \((\w+)\.x\+(\w+)\.x\);", section)
    order, result = [], None
    # Adds are printed innermost first: each after the first adds one partial to the last result.
    for target, left, right in adds:
        if result is None:
            order += [group_of[alias[left]], group_of[alias[right]]]
        else:
            assert left == result, (left, result)
            order.append(group_of[alias[right]])
        result = target
    return order


def test_postprocess_sums_split_partials_in_order_without_atomics(lowered):
    source = lowered["postprocess split"]
    assert "AtomicAdd" not in source and "atomic" not in source.lower()
    # dQ for blocks y < heads (32), then dK and dV, each the sum of its 4 partials in order.
    assert "if (((int)blockIdx.y) < 32) {" in source
    for buffer in ("dK", "dV"):
        assert partial_sum_order(source, buffer) == [0, 1, 2, 3], buffer


def test_dsinks_stores_once_per_head(lowered):
    source = lowered["dsinks"]
    assert re.search(r"if \(\(\(int\)threadIdx\.x\) == 0\) \{\s*dSinks\[\(\(int\)blockIdx\.x\)\] = ", source), source
    assert "AtomicAdd" not in source


def test_three_consumer_warpgroups_get_160_registers_without_a_warning(capfd):
    """The D64 forward on 192 query rows (384 threads, three consumer warpgroups beside the TMA
    producer) states its register split: consumers 160, producer 24 (384 x 160 + 128 x 24 fill
    the SM's 64512), which TileLang would otherwise pick itself with a warning at every build.
    Two consumer warpgroups keep TileLang's 240 / 24."""
    gqa = import_generated("gqa", "kernels")
    args = (32, 8, 64, False, 0, "bshd", "bfloat16", 0.125)
    three = lower(gqa.gqa_fwd, args, {"block_m": 192, "block_n": 128, "threads": 384, "num_stages": 1})
    assert "warpgroup_reg_alloc<160>" in three and "warpgroup_reg_dealloc<24>" in three
    assert "AnnotateWarpGroupRegAlloc" not in capfd.readouterr().err
    two = lower(gqa.gqa_fwd, args, {"block_m": 128, "block_n": 128, "threads": 256, "num_stages": 2,
                                    "overlap": True})
    assert "warpgroup_reg_alloc<240>" in two and "warpgroup_reg_dealloc<24>" in two


def test_two_blocks_an_sm_launch_at_128_registers_and_split_them_232_24():
    """blocks_per_sm = 2 (one consumer warpgroup): the forward's and the backward's kernels launch
    as two blocks an SM (__launch_bounds__(256, 2): 128 registers a thread) and hand 232 to the
    consumers and 24 to the producer (2 x 128 a thread in all). Without it the same tiling
    launches one block an SM, at TileLang's 240 / 24."""
    gqa = import_generated("gqa", "kernels")
    fwd_args = (32, 8, 64, True, 0, "bshd", "bfloat16", 0.125)
    tiling = {"block_m": 64, "block_n": 64, "threads": 128, "num_stages": 2}
    for factory, args in ((gqa.gqa_fwd, fwd_args), (gqa.gqa_bwd, (*fwd_args, "in_block", "in_block"))):
        two = lower(factory, args, {**tiling, "blocks_per_sm": 2})
        assert two.startswith("__launch_bounds__(256, 2)"), two[:40]
        assert "warpgroup_reg_alloc<232>" in two and "warpgroup_reg_dealloc<24>" in two
        one = lower(factory, args, tiling)
        assert one.startswith("__launch_bounds__(256, 1)"), one[:40]
        assert "warpgroup_reg_alloc<240>" in one and "warpgroup_reg_dealloc<24>" in one


def test_three_and_four_forward_blocks_an_sm_split_their_share_of_the_registers():
    """The forward on three blocks an SM launches at 80 registers a thread (65536 / 768, down to
    a multiple of 8) and hands 136 to the consumers, 24 to the producer; on four at 64, 104 / 24."""
    gqa = import_generated("gqa", "kernels")
    args = (32, 8, 64, True, 0, "bshd", "bfloat16", 0.125)
    tiling = {"block_m": 64, "block_n": 64, "threads": 128, "num_stages": 2}
    for blocks, consumer in ((3, 136), (4, 104)):
        code = lower(gqa.gqa_fwd, args, {**tiling, "blocks_per_sm": blocks})
        assert code.startswith(f"__launch_bounds__(256, {blocks})"), code[:40]
        assert f"warpgroup_reg_alloc<{consumer}>" in code and "warpgroup_reg_dealloc<24>" in code


def test_bulk_dq_adds_staged_tiles_by_bulk_reduce_and_leaves_the_atomic_kernel_as_it_was():
    """bulk_dq: the backward stages each step's dQ tile in shared memory and one thread adds it
    into the accumulator by bulk reduce-adds of 16 rows (no per-element atomics: with in_block
    dK/dV the kernel has none at all), waiting for the last step's adds before it overwrites the
    stage and for every add before it ends. Without bulk_dq the kernel adds dQ by atomics, and
    the stage it then allocates (one element, unused) is gone from the code."""
    gqa = import_generated("gqa", "kernels")
    args = (32, 8, 64, True, 0, "bshd", "bfloat16", 0.125, "in_block", "in_block")
    tiling = {"block_m": 128, "block_n": 128, "threads": 256, "num_stages": 2}
    bulk = lower(gqa.gqa_bwd, args, {**tiling, "bulk_dq": True})
    assert "tl::tma_store_add(" in bulk and "AtomicAdd" not in bulk
    adds = bulk.index("tl::tma_store_add(")
    # (The first consumer thread: the TMA producer warpgroup comes first.)
    assert re.search(r"if \(\(\(int\)threadIdx\.x\) == \d+\) \{\s*for \(int t = 0; t < 8; \+\+t\)",
                     bulk[:adds]), "one thread issues the 8 tiles of a 128-row step"
    assert "tl::tma_store_wait<0, true>();" in bulk[:adds]  # the stage read before it is written
    assert "tl::tma_store_wait<0, false>();" in bulk[adds:]  # every add done at the end
    atomic = lower(gqa.gqa_bwd, args, tiling)
    assert "tma_store_add" not in atomic and "AtomicAdd" in atomic and "dq_staged" not in atomic


def test_the_postprocess_reads_dq_in_the_layout_of_the_bwd_kernel():
    """The accumulator's layout is the bwd kernel's: with bulk_dq in 16-row tiles whose rows'
    16-byte chunks are swizzled (an XOR in every dQ index), else in the fragment order of the
    atomics (no XOR)."""
    gqa = import_generated("gqa", "kernels")
    args = (32, 8, 128, "bshd", "bfloat16", 0.125, "in_block", "in_block")

    def dq_reads(source):
        return [line for line in source.splitlines() if re.search(r"\bdQ( \+ |\[)", line)]

    tiled = dq_reads(lower(gqa.gqa_bwd_postprocess, args, {**TILING["postprocess"], "bulk_dq": True}))
    fragments = dq_reads(lower(gqa.gqa_bwd_postprocess, args, TILING["postprocess"]))
    assert tiled and all("^" in line for line in tiled), tiled
    assert fragments and not any("^" in line for line in fragments), fragments


def test_the_softmax_scale_multiplies_dk_at_its_store_and_dq_in_the_postprocess():
    """dS leaves the softmax scale out (a multiply per element of every step): the backward
    multiplies dK by it once, after its walk, and the postprocess multiplies dQ as it casts it.
    0.125 is 0x1p-3f in the CUDA source; the scores' exp2 uses 0.125 * LOG2E, another constant."""
    gqa = import_generated("gqa", "kernels")
    tiling = {"block_m": 128, "block_n": 64, "threads": 256, "num_stages": 2}
    bwd = lower(gqa.gqa_bwd, (32, 8, 128, True, 0, "bshd", "bfloat16", 0.125, "in_block", "in_block"), tiling)
    assert bwd.count("0x1p-3f") == 1, "one multiply by the scale"
    scaled = bwd.index("0x1p-3f")
    # The walk's steps end with dQ's atomics: the multiply comes after the last of them.
    assert bwd.rindex("AtomicAdd((&(dQ[") < scaled < bwd.index("tma_store(dK_desc"), (
        "dK takes the scale after the walk's steps, before its store")
    postprocess = lower(gqa.gqa_bwd_postprocess, (32, 8, 128, "bshd", "bfloat16", 0.125, "in_block", "in_block"),
                        TILING["postprocess"])
    assert postprocess.count("0x1p-3f") == 1, "one multiply by the scale"
    assert postprocess.index("0x1p-3f") < postprocess.index("__float22bfloat162_rn"), (
        "dQ scaled as it is cast")


def test_the_postprocess_moves_dq_in_16_byte_vectors():
    """The dQ accumulator in the atomics' fragment order is read as two 16-byte runs a thread
    and dQ stored as one 16-byte vector of 8 columns, in both layouts; the bulk-dq layout keeps
    its element loop."""
    attention = import_generated("attention", "kernels")
    for layout in ("bshd", "bhsd"):
        cuda = lower(attention.attention_bwd_postprocess,
                     (16, 16, 128, layout, "float16", 0.125, "direct", "direct"), TILING["postprocess"])
        assert "*(float4*)(dQ + " in cuda and "*(uint4*)(dQ_out + " in cuda, layout
    bulk = lower(attention.attention_bwd_postprocess, (16, 16, 128, "bshd", "float16", 0.125, "direct", "direct"),
                 {**TILING["postprocess"], "bulk_dq": True})
    assert "*(uint4*)(dQ_out + " not in bulk


def test_code_without_comments_and_docstrings_lowers_to_the_same_cuda(tmp_path):
    """The compile cache and the manifests key a kernel on kernels.py's code without comments
    and docstrings (kernel_code): that code lowers to the same CUDA, here the sinks-and-window
    forward (its T.macro helpers carry docstrings)."""
    import importlib.util

    from opgen.render import kernel_code

    sink = import_generated("attention_sink", "kernels")
    bare_py = tmp_path / "bare_kernels.py"
    bare_py.write_text(kernel_code(Path(sink.__file__).read_text()))
    assert '"""' not in bare_py.read_text() and "#" not in bare_py.read_text()
    spec = importlib.util.spec_from_file_location("bare_kernels", bare_py)
    bare = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bare)
    args = (32, 8, 64, True, 128, "bshd", "bfloat16", 0.125)
    tiling = {"block_m": 64, "block_n": 64, "threads": 128, "num_stages": 2}
    assert lower(bare.attention_sink_fwd, args, tiling) == lower(sink.attention_sink_fwd, args, tiling)


def indices_by_mask(factory, args_of, pattern):
    """{causal: the groups of `pattern` in each line of factory's kernel lowered at args_of(causal)
    (the gqa D64 tiling below)}: a kernel's tile loads, with their block indices."""
    tiling = {"block_m": 64, "block_n": 64, "threads": 128, "num_stages": 1}
    return {causal: re.findall(pattern, lower(factory, args_of(causal), tiling)) for causal in (True, False)}


def test_causal_forward_launches_heads_fastest():
    """The forward block's query block and head from the grid (attention_launch.launch_grid):
    causal, the head is blockIdx.x and the query block counts down from the last with blockIdx.y
    (every head's longest block first); full, the query block is blockIdx.x (query blocks fastest,
    for L2). Q's tile load shows both indices."""
    gqa = import_generated("gqa", "kernels")
    # (the query row of the tile, the query head's index) of each of Q's tile loads
    found = indices_by_mask(
        gqa.gqa_fwd, lambda causal: (32, 8, 64, causal, 0, "bshd", "bfloat16", 0.125),
        r"tma_load\(Q_desc, [^;]*?, 0, (.*), \(\(int\)blockIdx\.(\w)\), \(\(int\)blockIdx\.z\)\);")
    assert found[True] and set(found[True]) == {
        ("(((((seq_len + 63) >> 6) * 64) - (((int)blockIdx.y) * 64)) - 64)", "x")}, found[True]
    assert found[False] and set(found[False]) == {("(((int)blockIdx.x) * 64)", "y")}, found[False]


def test_causal_backward_launches_heads_fastest():
    """The backward block's key block and head from the grid (attention_launch.launch_grid): causal,
    the head is blockIdx.x and the key block blockIdx.y, so every head's key block 0 (the longest)
    launches first; full, the other way round (key blocks fastest, for L2). The kernel is the same
    code either way but for the two indices."""
    gqa = import_generated("gqa", "kernels")
    # (the key block's index, the KV head's index) of each of K's tile loads
    found = indices_by_mask(
        gqa.gqa_bwd,
        lambda causal: (32, 8, 64, causal, 0, "bshd", "bfloat16", 0.125, "in_block", "in_block"),
        r"tma_load\(K_desc, [^;]*?\(\(\(int\)blockIdx\.(\w)\) \* 64\), \(\(int\)blockIdx\.(\w)\)")
    assert found[True] and set(found[True]) == {("y", "x")}, found[True]
    assert found[False] and set(found[False]) == {("x", "y")}, found[False]


def test_backward_dq_atomics_carry_only_the_templates_guards():
    """Every bound of the backward is the template's own: a full block of queries adds its dQ
    rows with no guard at all (TileLang's safe-memory pass, which would add one per pair of adds
    against padded_rows, is off for this kernel), the last, partial block guards each row
    against seq_len, and rows past seq_len are never added."""
    attention = import_generated("attention", "kernels")
    args = (16, 16, 128, False, 0, "bshd", "float16", 128 ** -0.5, "direct", "direct")
    tiling = {"block_m": 128, "block_n": 64, "threads": 256, "num_stages": 2}
    source = lower(attention.attention_bwd, args, tiling)
    adds = [m.start() for m in re.finditer(r"AtomicAdd\(\(&\(dQ\[", source)]
    assert len(adds) == 2, "one loop of adds per branch: full blocks, the tail block"
    guards = [re.findall(r"if \((.*)\) \{", source[source.rindex("for (", 0, at):at])
              for at in adds]
    assert guards[0] == [], guards[0]
    assert len(guards[1]) == 1 and "< seq_len" in guards[1][0], guards[1]
    assert "padded_rows" not in "".join(guards[1])


def test_descending_backward_walks_its_query_blocks_from_the_last_one_down():
    """descending: a causal block's first step loads the last query block (row
    ceil(seq_len / 64) * 64 - 64) and each step the one before it, down to its diagonal; without it
    the walk starts at the diagonal (the key block's first row) and goes up."""
    attention = import_generated("attention", "kernels")
    args = (16, 16, 128, True, 0, "bshd", "float16", 128 ** -0.5, "direct", "direct")
    tiling = {"block_m": 128, "block_n": 64, "threads": 256, "num_stages": 2}

    def query_rows(descending):
        source = lower(attention.attention_bwd, args, {**tiling, "descending": descending})
        return re.findall(r"tma_load\(Q_desc, [^;]*?\(i_\d \* 64\), (.*?), \(\(int\)blockIdx\.x\)",
                          source)

    assert set(query_rows(False)) == {"((((int)blockIdx.y) * 128) + (query_step * 64))"}
    assert set(query_rows(True)) == {"(((((seq_len + 63) >> 6) * 64) - (query_step * 64)) - 64)"}


PINGPONG = {"block_m": 128, "block_n": 128, "threads": 256, "num_stages": 2, "pingpong": True}


@pytest.fixture(scope="module")
def pingpong_source():
    """The whole CUDA source of gqa's ping-pong forward, D128 causal (32 / 8 heads, bf16)."""
    gqa = import_generated("gqa", "kernels")
    return cuda_source(gqa.gqa_fwd, (32, 8, 128, True, 0, "bshd", "bfloat16", 0.125), PINGPONG)


def consumer_sections(source):
    """The code of consumer warpgroups 0 and 1 of a ping-pong forward, in order."""
    first = source.index("if (((int)threadIdx.x) < 128) {")
    second = source.index("if ((128 <= ((int)threadIdx.x)) && (((int)threadIdx.x) < 256)) {")
    return source[first:second], source[second:]


def test_the_pingpong_forward_has_its_two_warpgroups_take_turns_at_the_tensor_cores(pingpong_source):
    """pingpong: two consumer warpgroups of 64 query rows (240 registers each) and a producer
    warpgroup (24) whose one warp loads the tiles by TMA, 384 threads in all. Before each key
    block's GEMMs warpgroup 0 waits on named barrier 1 and, once they are issued, arrives at
    barrier 2, on which warpgroup 1 waits; warpgroup 1 the other way round, arriving at barrier 1
    once before its first wait so that warpgroup 0 goes first. The one block-wide barrier is the
    mbarriers' set-up, before the warpgroups part."""
    source = pingpong_source[pingpong_source.index("__launch_bounds__"):]
    assert source.startswith("__launch_bounds__(384, 1) fwd_pingpong_kernel("), source[:60]
    assert source.count("__syncthreads()") == 1
    assert source.index("__syncthreads()") < source.index("if (256 <= ((int)threadIdx.x)) {")
    assert "tl::tma_load(Q_desc" in source and "tl::tma_load(K_desc" in source
    for w, section in enumerate(consumer_sections(source)):
        mine, other = 1 + w, 2 - w
        assert "tl::warpgroup_reg_alloc<240>();" in section
        waits = [m.start() for m in re.finditer(rf"__sync_thread_partial\({mine}, 256\)", section)]
        issues = [m.start() for m in re.finditer(r"tl::wgmma_ss<", section)]
        arrivals = [m.start() for m in re.finditer(rf"__named_barrier_arrive\({other}, 256\)", section)]
        # The first key block alone, then the loop: a wait, its GEMMs, an arrival, each time.
        assert len(waits) == 2 and len(arrivals) == 2 + w, (w, waits, arrivals)
        assert "__sync_thread_partial(" + str(other) not in section
        first_wait, loop_wait = waits
        assert first_wait < issues[0] < arrivals[w] < loop_wait, w
        assert any(loop_wait < i < arrivals[w + 1] for i in issues), w
    # Warpgroup 1's first arrival comes before its first wait.
    one = consumer_sections(source)[1]
    assert one.index("__named_barrier_arrive(1, 256)") < one.index("__sync_thread_partial(2, 256)")


def test_the_pingpong_forward_stores_o_by_tma_from_each_warpgroup_s_q_tile(pingpong_source):
    """Each consumer warpgroup casts its O rows into its own Q tile (free after its last scores
    GEMM), waits for its 128 threads at a named barrier of its own (3 + w: 1 and 2 are the
    turns'), and one elected thread stores the tile by TMA, which stops at seq_len by itself.
    No thread stores O from registers: with seq_len symbolic each such store carries a guard and
    64-bit address arithmetic (5-6% of the D128 forwards on an H100)."""
    source = pingpong_source[pingpong_source.index("__launch_bounds__"):]
    signature = source[:source.index(") {")]
    assert "const CUtensorMap O_desc" in signature and "__restrict__ O," not in signature
    for w, section in enumerate(consumer_sections(source)):
        fence = section.index("tl::fence_proxy_async();")
        barrier = section.index(f"tl::__sync_thread_partial({3 + w}, 128);")
        store = section.index("tl::tma_store(O_desc, (&(((bfloat16_t*)Q_shared)[")
        assert fence < barrier < store, w
        assert section.count("tl::tma_store(O_desc") == 1, w  # in a loop over the dim's halves
        assert section.index("tl::tma_store_wait<0, true>();") > store, w


def test_the_causal_forward_masks_a_score_by_one_compare(pingpong_source):
    """A causal forward's diagonal tile keeps a score where the key is not after the query, and
    tests nothing else: the key's bound (k < seq_len) follows from it for rows inside the
    sequence, and rows past seq_len are never stored. With seq_len a runtime value each further
    bound is a compare and a select per score (the D128 causal forward's diagonal tile took 509
    SASS instructions a warp, against 132 with seq_len a constant)."""
    source = pingpong_source[pingpong_source.index("__launch_bounds__"):]
    for w, section in enumerate(consumer_sections(source)):
        keeps = [m.start() for m in re.finditer(r"condval(_\d+)? = acc_s(_\d+)?\[", section)]
        assert keeps, w  # the first key block's tile and the loop's
        for keep in keeps:
            condition = section[section.rindex("if (", 0, keep):keep]
            assert condition.count(" <= ") == 1 and condition.count(" < ") == 0, (w, condition)
            assert "&&" not in condition and "||" not in condition, (w, condition)


def test_a_windowed_call_of_a_pingpong_tiling_runs_the_pingpong_forward():
    """A sliding-window call of a tiling with pingpong runs the ping-pong forward (its key range
    and mask are the window's); at a window so short that the block walks heads it runs that
    kernel, whatever the tiling's schedule."""
    sink = import_generated("attention_sink", "kernels")
    args = (32, 8, 128, True, 1024, "bshd", "bfloat16", 0.125)
    tiling = {"block_m": 128, "block_n": 128, "threads": 256, "num_stages": 2}
    windowed = lower(sink.attention_sink_fwd, args, {**tiling, "pingpong": True})
    assert "fwd_pingpong_kernel" in windowed
    assert windowed != lower(sink.attention_sink_fwd, (*args[:4], 0, *args[5:]), {**tiling, "pingpong": True})
    short = lower(sink.attention_sink_fwd, (*args[:4], 16, *args[5:]), {**tiling, "pingpong": True})
    assert "fwd_heads_kernel" in short


def ptxas_notes(source, tmp_path) -> str:
    """nvcc's and ptxas's output for a lowered kernel's whole CUDA source, compiled for sm_90a as
    TileLang compiles it; asserts that it compiled."""
    import subprocess

    import tilelang

    (tmp_path / "kernel.cu").write_text(source)
    root = Path(tilelang.__file__).parent
    result = subprocess.run(
        ["nvcc", "-gencode", "arch=compute_90a,code=sm_90a", "-cubin", "-o", str(tmp_path / "kernel.cubin"),
         "--ptxas-options=--verbose", "-std=c++17", "-DNDEBUG", "--use_fast_math",
         f"-I{root / 'src'}", f"-I{root / '3rdparty' / 'cutlass' / 'include'}", str(tmp_path / "kernel.cu")],
        capture_output=True, text=True)
    notes = result.stdout + result.stderr
    assert result.returncode == 0, notes[-3000:]
    return notes


def test_the_pingpong_forward_compiles_with_no_wgmma_serialized(pingpong_source, tmp_path):
    """ptxas keeps every WGMMA of the ping-pong forward asynchronous: a register a WGMMA reads,
    written between two issues, or a barrier's wait loop between them, makes it serialize all of
    them (warning C7513 or C7512), and the two warpgroups' GEMMs would no longer overlap the
    softmax. No spills either."""
    notes = ptxas_notes(pingpong_source, tmp_path)
    assert not re.search(r"C75\d\d", notes), notes
    assert " 0 bytes spill stores" in notes, notes


def test_the_pingpong_forward_on_176_key_rows_keeps_its_wgmmas_async(tmp_path):
    """A key block of 176 rows (not a power of two; a WGMMA's N and K): each warpgroup's 64 x 176
    fp32 scores fit its 240 registers beside the output, so ptxas neither spills nor serializes
    the WGMMAs, and two stages of K and V with Q take 208 KB of shared memory."""
    attention = import_generated("attention", "kernels")
    source = cuda_source(attention.attention_fwd,
                         (16, 16, 128, False, 0, "bshd", "float16", 128 ** -0.5),
                         {**PINGPONG, "block_n": 176})
    # The scores: 64 x 176 by WGMMAs from shared memory; the output: P (registers) times V.
    assert "kFloat32, 64, 176, 16, false, false, 1, 1>" in source
    assert "kFloat32, 64, 128, 16, false, true, 1, 1>" in source
    notes = ptxas_notes(source, tmp_path)
    assert not re.search(r"C75\d\d", notes), notes
    assert " 0 bytes spill stores" in notes, notes
