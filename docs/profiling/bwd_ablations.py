"""Variants of a shipped attention backward made by editing the package's own kernels.py, each
loaded as a module of its own. Ablations, for timing only (their dQ is wrong by design): how much
of the backward's time its dQ path costs.

- no-dq-atomics: the dQ GEMM kept, its per-element fp32 atomics skipped (guarded by a condition
  on a loaded lse value that never holds, so neither the GEMM nor the atomics are dead code to
  the compiler; a condition on dQ's own values breaks TileLang's layout inference). If the
  backward gets much faster, the atomics (their instructions, or L2's reduction throughput: 32 KB
  a step per block at D128 128x64) bound it.
- no-dq: dS's shared-memory store, the dQ GEMM and the atomics all cut: the whole dQ path.

And one candidate, right by construction (the probe checks its gradients):

- bulk-dq: each step's dQ tile staged in shared memory (fp32, each row's 16-byte chunks
  swizzled) and added into the accumulator by one bulk reduce (`cp.reduce.async.bulk ...
  add.f32`, issued by one thread), whose wait for the tile's read is deferred to the next step,
  just before the barrier that precedes dS's store (the tile is long read by then). The
  accumulator is laid out in tiles of DQ_TILE rows, each contiguous and in the staged tile's
  order, so a tile is one bulk copy; the probe pads the variant's accumulator rows to a multiple
  of DQ_TILE (lse and Delta keep theirs: each buffer's padded rows are a symbol of its own). The
  padding rows take zeros from masked queries, and the postprocess never reads them. Run 55 tried
  TileLang's own TMA reduce (`use_tma=True`), which waits for each read at once: 3-7% slower.

    from bwd_ablations import edited_kernels
    K = edited_kernels("attention", "no-dq-atomics")   # K.attention_bwd: the ablated factory
"""
import importlib.util
import os
import re
import sys
import tempfile

# The bwd loop's dQ atomics: both branches (the tail block's guarded one too), up to the loop's
# end. A pattern rather than the text, so the kernel's lines are not copied here.
ATOMICS = re.compile(r"^ +if k \* block_n \+ block_n <= seq_len:\n(?:.*\n)*? +T\.atomic_add\(elem\(dQ.*\n"
                     r"(?: +else:\n(?:.*\n)*? +T\.atomic_add\(elem\(dQ.*\n)", re.M)
NEVER = """\
                if lse_shared[0] == 1234567.0:  # never: the dQ GEMM stays, its atomics are skipped
                    for i, j in T.Parallel(block_n, dim):
                        T.atomic_add(elem(dQ, bz, h, k * block_n + i, j), dq[i, j])
"""
DQ_PATH = """\
                T.copy(dsT_cast, dsT_shared)
                T.clear(dq)
                T.gemm(dsT_shared, K_shared, dq, transpose_A=True)
"""
ABLATIONS = {
    "no-dq-atomics": [(ATOMICS, NEVER)],
    "no-dq": [(ATOMICS, ""), (DQ_PATH, "")],
}

DQ_TILE = 16
LAYOUT = re.compile(r"def _dq_layout\(layout, dQ\):.*?\n\n\n", re.S)
TILE_LAYOUT = f"""\
DQ_TILE = {DQ_TILE}


def _swizzled(row, col):
    # A row's 16-byte chunks XORed with the row's index mod 8: the staged tile's stores from the
    # GEMM fragment (8 rows a warp, 512 bytes apart) spread over every bank.
    return ((col // 4) ^ (row % 8)) * 4 + col % 4


def _dq_layout(layout, dQ):
    # Tiles of DQ_TILE rows of one head, each contiguous, in the staged tile's (swizzled) order:
    # one bulk add a tile.
    if layout == "bshd":
        return T.Layout(dQ.shape, lambda b, l, h, d: [b, h, l // DQ_TILE, l % DQ_TILE, _swizzled(l, d)])
    return T.Layout(dQ.shape, lambda b, h, l, d: [b, h, l // DQ_TILE, l % DQ_TILE, _swizzled(l, d)])


"""
BULK = [
    ("""\
            T.annotate_layout({dQ: _dq_layout(layout, dQ)})
            kv_head = bx if in_block else bx // groups
""", """\
            dq_staged = T.alloc_shared([block_n, dim], ACCUM)
            T.annotate_layout({dQ: _dq_layout(layout, dQ),
                               dq_staged: T.Layout([block_n, dim], lambda i, j: [i, _swizzled(i, j)])})
            tx = T.get_thread_binding()
            kv_head = bx if in_block else bx // groups
"""),
    ("""\
                T.copy(dsT_cast, dsT_shared)
""", """\
                if tx == 0:
                    # The last step's bulk add has read dq_staged by now (a whole step ago); the
                    # barrier before dS's store below tells every thread.
                    T.tma_store_wait(0)
                T.copy(dsT_cast, dsT_shared)
"""),
    (ATOMICS, """\
                T.copy(dq, dq_staged)
                T.fence_proxy_async()
                T.sync_threads(5, threads)
                if tx == 0:
                    for t in T.serial(block_n // DQ_TILE):
                        # The last query block's tiles past the accumulator's rows hold no query.
                        if k * block_n + t * DQ_TILE < dQ.shape[1 if layout == "bshd" else 2]:
                            T.call_extern(
                                "handle", "tl::tma_store_add",
                                T.address_of(dq_staged[t * DQ_TILE, 0]),
                                T.address_of(elem(dQ, bz, h, k * block_n + t * DQ_TILE, 0)),
                                DQ_TILE * dim * 4)
                    T.tma_store_arrive()
"""),
    ("""\
            store_dkv(dv, dv_shared, dV, dv_reduction, bx, by, bz)
""", """\
            if tx == 0:
                T.tma_store_wait(0, read=False)
            store_dkv(dv, dv_shared, dV, dv_reduction, bx, by, bz)
"""),
]
# The preprocess zeroes dQ through the tiled layout too: in plain row order its rows up to
# ceildiv(seq_len, block_m) * block_m would be other physical elements than the tiles'. It zeroes
# every real row (rows past the accumulator's, with 16-row tiles, are skipped; padding rows it
# leaves are never read).
BULK += [
    ("""\
            o = T.alloc_fragment([block_m, dim], dtype)
""", """\
            o = T.alloc_fragment([block_m, dim], dtype)
            T.annotate_layout({dQ: _dq_layout(layout, dQ)})
"""),
    ("""\
            T.copy(zeros, rows(dQ, bz, by, bx * block_m, block_m))
""", """\
            for i, j in T.Parallel(block_m, dim):
                if bx * block_m + i < dQ.shape[1 if layout == "bshd" else 2]:  # the tiles' rows
                    T.buffer_store(dQ, zeros[i, j], _indexers(layout)[2](bz, by, bx * block_m + i, j))
"""),
]
EDITS = {**ABLATIONS, "bulk-dq": BULK}


def edited_source(package, variant):
    path = os.path.join(os.getcwd(), "generated", package, "kernels.py")
    with open(path) as f:
        source = f.read()
    if variant == "bulk-dq":
        source, count = LAYOUT.subn(lambda m: TILE_LAYOUT, source)
        if count != 1:
            raise RuntimeError(f"{path}: _dq_layout's text changed; update bwd_ablations.py")
    for old, new in EDITS[variant]:
        if isinstance(old, re.Pattern):
            source, count = old.subn(lambda m: new, source)
        else:
            count = source.count(old)
            source = source.replace(old, new)
        if count != 1:
            raise RuntimeError(f"{path}: the bwd kernel's text changed; update bwd_ablations.py")
    return source


# TileLang parses each kernel function from its source file: the edited modules live in files.
FOLDER = tempfile.mkdtemp(prefix="bwd_ablations_")


def edited_kernels(package, variant):
    """generated/<package>/kernels.py with the variant's edits, as a module of its own."""
    name = f"edited_{package}_{variant.replace('-', '_')}"
    if name not in sys.modules:
        path = os.path.join(FOLDER, name + ".py")
        with open(path, "w") as f:
            f.write(edited_source(package, variant))
        spec = importlib.util.spec_from_file_location(name, path)
        module = sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return sys.modules[name]
