"""`opgen plot`: a benchmark's sweep, from the JSON its `--sweep --json PATH` run wrote, drawn as
forward and backward throughput against the swept size, one line per implementation, one panel
per pass.

matplotlib is an optional extra (`pip install 'opgen[plot]'`), imported only when a plot is
drawn: the GPU machine that runs the benchmark needs none of it, and the generated packages never
import opgen. The bench's JSON is an object of metadata (package, dtype, unit, sweep axis,
versions, GPU, date) and `rows`, one record per table row: table, case (the shape's fields),
implementation, fwd_throughput and bwd_throughput, or the error that kept it from running.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opgen.errors import OpgenError

INSTALL = "pip install 'opgen[plot]'"
PASSES = (("forward", 1), ("backward", 2))  # each panel's title, its column in Line.points
REASON_CHARS = 48  # of a baseline's error, in its legend entry


class MissingMatplotlib(OpgenError):
    """The plot needs matplotlib, which is not installed (a missing tool, not a bad input)."""

    exit_code = 1


def figure_class() -> type:
    """matplotlib's Figure (drawn and saved without pyplot or a display), or MissingMatplotlib."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise MissingMatplotlib(f"opgen plot: matplotlib is not installed; {INSTALL}") from None
    return Figure


@dataclass
class Line:
    """One implementation across the sweep: its points (x, fwd, bwd) and where it did not run."""

    points: list[tuple[int, float, float]] = field(default_factory=list)
    missing: dict[int, str] = field(default_factory=dict)  # x -> error

    def label(self, name: str) -> str:
        if not self.points:
            reason = next(iter(self.missing.values()))
            cut = reason if len(reason) <= REASON_CHARS else reason[: REASON_CHARS - 3] + "..."
            return f"{name} (n/a: {cut})"
        if self.missing:
            return f"{name} (n/a at {', '.join(map(str, self.missing))})"
        return name


@dataclass(frozen=True)
class SweepData:
    """What the plot draws from a bench's JSON."""

    meta: dict[str, Any]
    axis: str
    label: str
    fixed: str  # the case fields that stay put over the sweep, as words
    xs: tuple[int, ...]
    lines: dict[str, Line]  # implementation -> its line, in the bench's order


def read_sweep(path: Path) -> SweepData:
    """The sweep rows of a bench's --json file, or OpgenError saying what is wrong with it."""
    shown = path.as_posix()
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise OpgenError(f"{shown}: cannot read it ({exc.strerror or exc})") from None
    except ValueError:
        raise OpgenError(f"{shown}: not valid JSON") from None
    try:
        axis, label = data["sweep"]["axis"], data["sweep"]["label"]
        rows = [r for r in data["rows"] if r["table"] == "sweep"]
        if not rows:
            raise OpgenError(f"{shown}: no sweep rows; write them with `opgen bench NAME --sweep "
                             f"--json {shown}` (or the bench's own --sweep --json)")
        lines: dict[str, Line] = {}
        for r in rows:
            x, line = r["case"][axis], lines.setdefault(r["implementation"], Line())
            if r.get("error") is not None:
                line.missing[x] = str(r["error"])
            else:
                line.points.append((x, float(r["fwd_throughput"]), float(r["bwd_throughput"])))
        cases = [r["case"] for r in rows]
    except (KeyError, TypeError, ValueError) as exc:
        raise OpgenError(f"{shown}: not the JSON of a bench's --sweep --json run "
                         f"({type(exc).__name__}: {exc})") from None
    fixed = [f"{k}={v}" for k, v in cases[0].items()
             if k != axis and v is not None and all(c.get(k) == v for c in cases)]
    xs = tuple(sorted({c[axis] for c in cases}))
    return SweepData(data, axis, label, ", ".join(fixed), xs, lines)


def plot_sweep(rows_path: Path, out_path: Path) -> None:
    """Draw the sweep in rows_path (a bench's --json file) into out_path (PNG, or any format
    matplotlib writes, by its suffix)."""
    figure = figure_class()
    sweep = read_sweep(rows_path)
    meta = sweep.meta
    fig = figure(figsize=(12, 4.8), layout="constrained")
    panels = fig.subplots(1, 2)
    for panel, (title, column) in zip(panels, PASSES):
        for i, (name, line) in enumerate(sweep.lines.items()):
            xs = [p[0] for p in line.points]
            ys = [p[column] for p in line.points]
            # opgen's own line (the bench lists it first) stands out.
            panel.plot(xs, ys, marker="o", linewidth=2.6 if i == 0 else 1.4,
                       label=line.label(name), zorder=3 if i == 0 else 2)
        panel.set_xscale("log", base=2)
        panel.set_xticks(sweep.xs, [str(x) for x in sweep.xs])
        panel.minorticks_off()
        panel.set_ylim(bottom=0)
        panel.set_title(title)
        panel.set_xlabel(sweep.label)
        panel.set_ylabel(str(meta.get("unit", "")))
        panel.grid(alpha=0.3)
    # One legend for both panels (the same colours), under them: it hides no line.
    handles, labels = panels[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=min(len(labels), 3),
               fontsize="small", frameon=False)
    fig.suptitle(
        f"{meta.get('package', '?')}, {meta.get('dtype', '?')}"
        + (f" ({sweep.fixed})" if sweep.fixed else "")
        + f"\n{meta.get('gpu') or 'unknown GPU'}, torch {meta.get('torch', '?')}, "
        f"tilelang {meta.get('tilelang', '?')}, {str(meta.get('date', '?'))[:10]}",
        fontsize="medium",
    )
    try:
        # No "Software" entry: the same rows give the same file, whatever matplotlib drew it.
        fig.savefig(out_path, dpi=110, metadata={"Software": None})
    except OSError as exc:
        raise OpgenError(f"{out_path.as_posix()}: cannot write it ({exc.strerror or exc})"
                         ) from None
    except ValueError as exc:  # an unknown format (suffix)
        raise OpgenError(f"{out_path.as_posix()}: {exc}") from None
