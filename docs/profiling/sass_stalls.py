"""The SASS instructions a kernel's warps stall on most, from Nsight Compute's source page as CSV
(`bash docs/profiling/next_gpu_run.sh source attention full` writes it gzipped):

    python docs/profiling/sass_stalls.py source-attention-full-sass.csv.gz [top]

Prints the `top` (default 40) instructions by warp stall samples, with their share of all samples
and their address, and the samples summed by opcode (HGMMA, RED, BAR, SYNCS, ...): where the
issue slots go. Columns are found by name, so a newer ncu's extra columns do not matter."""
import csv
import gzip
import sys
from collections import Counter


def rows(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", newline="") as f:
        lines = [line for line in f if line.startswith('"')]  # ncu's banner lines are not CSV
    # A "Kernel Name" line comes before the header row, which starts with "Address".
    lines = lines[next(i for i, line in enumerate(lines) if line.startswith('"Address"')):]
    return list(csv.DictReader(lines))


def column(header, *words):
    for name in header:
        if all(w.lower() in name.lower() for w in words):
            return name
    raise SystemExit(f"no column with {words} in {header}")


def samples(value):
    try:
        return float(value.replace(",", ""))
    except ValueError:
        return 0.0


if __name__ == "__main__":
    path, top = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 40
    table = rows(path)
    header = list(table[0])
    source, address = column(header, "source"), column(header, "address")
    stall = column(header, "warp stall sampling", "all")
    total = sum(samples(r[stall]) for r in table) or 1.0
    print(f"{len(table)} instructions, {total:.0f} stall samples")
    by_opcode = Counter()
    for r in table:
        words = [w for w in r[source].split() if not w.startswith("@")]  # @P0: a predicate
        by_opcode[words[0].split(".")[0] if words else "?"] += samples(r[stall])
    print("by opcode: " + ", ".join(f"{op} {n / total:.1%}" for op, n in by_opcode.most_common(12)))
    for r in sorted(table, key=lambda r: -samples(r[stall]))[:top]:
        print(f"{samples(r[stall]) / total:6.1%}  {r[address]:>8}  {r[source]}")
