"""The generated benchmarks' rows as JSON (--json) and CSV (--csv), their sweep (--sweep) and command line, on the
CPU: the record and write functions are called with made-up numbers, no GPU timing.
"""

from __future__ import annotations

import csv
import datetime
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import REPO_ROOT, import_generated

from opgen.plot import read_sweep
from opgen.render import load_plan

SHIPPED = sorted(p.stem for p in (REPO_ROOT / "specs").glob("*.toml"))


def bench_of(name: str):
    return import_generated(name, f"bench_{name}")


def plan_of(name: str):
    return load_plan(REPO_ROOT / "specs" / f"{name}.toml")[0]


@pytest.mark.parametrize("name", SHIPPED)
def test_records_are_written_as_json_with_their_metadata(name, tmp_path):
    bench = bench_of(name)
    path = tmp_path / "rows.json"
    records = bench.Records(str(path))
    shape = bench.SHAPES[0]
    case = dict(zip(bench.CASE_FIELDS, shape))
    records.timed("shapes", case, f"opgen {name}", 1.5, 300.0, 4.0, 250.0)
    records.add("shapes", case, "a baseline", error="not installed")
    records.add("host overhead", {"shape": bench.TINY}, f"opgen {name}", fwd_us=30.5, fwd_bwd_us=99.0)
    records.save()

    data = json.loads(path.read_text())
    assert not list(tmp_path.glob("*.partial")), "written beside the file, then renamed over it"
    assert data["package"] == name
    assert data["unit"] == plan_of(name).bench_unit
    assert data["dtype"] == plan_of(name).bench.dtype
    assert data["sweep"] == {"axis": bench.SWEEP_AXIS, "label": bench.SWEEP_LABEL}
    assert data["torch"] == torch.__version__ and data["tilelang"]
    if not torch.cuda.is_available():
        assert data["gpu"] is None
    assert datetime.datetime.fromisoformat(data["date"]).tzinfo is not None
    assert data["rows"] == [
        {"table": "shapes", "case": case, "implementation": f"opgen {name}", "fwd_ms": 1.5,
         "fwd_throughput": 300.0, "bwd_ms": 4.0, "bwd_throughput": 250.0, "unit": data["unit"],
         "error": None},
        {"table": "shapes", "case": case, "implementation": "a baseline", "error": "not installed"},
        {"table": "host overhead", "case": {"shape": bench.TINY}, "implementation": f"opgen {name}",
         "fwd_us": 30.5, "fwd_bwd_us": 99.0, "error": None},
    ]
    # Every case value is a plain JSON value (ints, bools, None): the case reads back as written.
    assert all(isinstance(v, (int, bool, type(None))) for v in case.values())


@pytest.mark.parametrize("name", ["attention", "swiglu"])
def test_records_are_written_as_csv_one_line_per_row(name, tmp_path):
    """The same rows as the JSON, flattened: the case's fields and every number as columns, a
    missing value empty, the metadata on every line."""
    bench = bench_of(name)
    records = bench.Records(str(tmp_path / "rows.json"), str(tmp_path / "rows.csv"))
    case = dict(zip(bench.CASE_FIELDS, bench.SHAPES[0]))
    records.timed("shapes", case, f"opgen {name}", 1.5, 300.0, 4.0, 250.0)
    records.add("shapes", case, "a baseline", error="not installed")
    records.add("host overhead", {"shape": bench.TINY}, f"opgen {name}", fwd_us=30.5, fwd_bwd_us=99.0)
    records.save()

    assert not list(tmp_path.glob("*.partial"))
    with open(tmp_path / "rows.csv", newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        lines = list(reader)
    header = reader.fieldnames
    assert header[:len(case) + 1] == ["table", *case]
    assert header.index("implementation") < header.index("fwd_ms") < header.index("error")
    assert len(header) == len(set(header)), "no column twice (the row's unit is the metadata's)"
    data = json.loads((tmp_path / "rows.json").read_text())
    assert len(lines) == len(data["rows"]) == 3
    first, failed, host = lines
    assert {k: first[k] for k in case} == {k: str(v) if v is not None else "" for k, v in case.items()}
    assert (first["implementation"], float(first["fwd_ms"]), float(first["bwd_throughput"])) == (
        f"opgen {name}", 1.5, 250.0)
    assert first["error"] == "" and first["fwd_us"] == "" and first["shape"] == ""
    assert failed["error"] == "not installed" and failed["fwd_ms"] == ""
    assert host["table"] == "host overhead" and float(host["fwd_bwd_us"]) == 99.0
    for line in lines:
        assert line["package"] == name and line["unit"] == data["unit"]
        assert line["date"] == data["date"] and line["sweep"] == bench.SWEEP_AXIS


def test_records_keep_the_columns_a_table_adds_and_write_nothing_without_a_path(tmp_path):
    bench = bench_of("swiglu")
    records = bench.Records()
    records.timed("sweep", {"rows": 8, "channels": 64}, "opgen swiglu", 1.0, 10.0, 2.0, 8.0,
                  fwd_vs_copy=0.9, bwd_vs_copy=0.8)
    records.save()
    assert records.rows[0]["fwd_vs_copy"] == 0.9 and records.rows[0]["bwd_vs_copy"] == 0.8
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("name", SHIPPED)
def test_the_sweep_steps_one_dim_of_the_first_shape(name):
    """SWEEP holds SHAPES' tuples: the first shape with the plan's axis at each point (matmul:
    m = n = k), each with its own FLOPs or bytes; a few points, smallest first."""
    bench, plan = bench_of(name), plan_of(name)
    assert len(bench.CASE_FIELDS) == len(bench.SHAPES[0]) - 2 == len(bench.SWEEP[0]) - 2
    assert bench.SWEEP == [case.row for case in plan.sweep.cases]
    axis = bench.CASE_FIELDS.index(bench.SWEEP_AXIS)
    assert [s[axis] for s in bench.SWEEP] == list(plan.sweep.points) == sorted(plan.sweep.points)
    assert 4 <= len(bench.SWEEP) <= 6
    first = dict(zip(bench.CASE_FIELDS, bench.SHAPES[0]))
    costs = [s[-2:] for s in bench.SWEEP]
    assert costs == sorted(costs) and len(set(costs)) == len(costs)
    for point in bench.SWEEP:
        case = dict(zip(bench.CASE_FIELDS, point))
        if name == "matmul":
            assert case["m"] == case["n"] == case["k"]
        else:
            assert {k: v for k, v in case.items() if k != bench.SWEEP_AXIS} == {
                k: v for k, v in first.items() if k != bench.SWEEP_AXIS}


def test_row_sweeps_stay_within_the_element_limit():
    from opgen.plan import MAX_SWEEP_ELEMENTS

    for name in ("rmsnorm", "scaled_silu", "swiglu"):
        for rows, channels, *_ in bench_of(name).SWEEP:
            assert rows * channels <= MAX_SWEEP_ELEMENTS


def test_matmul_sweep_variants_are_compile_checked():
    """n and k are compile-time in matmul's kernels: each sweep point is a compile job."""
    plan = plan_of("matmul")
    checked = {job.args[:2] for job in plan.compile_jobs if job.factory == "matmul_fwd"}
    assert {(size, size) for size in plan.sweep.points} <= checked


def test_sweep_records_are_what_opgen_plot_reads(tmp_path):
    """The generated writer and opgen's reader agree: a sweep written by Records reads back as one
    line per implementation, a baseline that failed at a point as missing there."""
    bench = bench_of("attention_sink")
    records = bench.Records(str(tmp_path / "rows.json"))
    for i, point in enumerate(bench.SWEEP):
        case = dict(zip(bench.CASE_FIELDS, point))
        records.timed("sweep", case, "opgen attention_sink", 1.0, 100.0 + i, 2.0, 50.0 + i)
        records.add("sweep", case, "SDPA cuDNN", error="no sinks")
        if i < len(bench.SWEEP) - 1:
            records.timed("sweep", case, "FlexAttention", 1.0, 90.0, 2.0, 40.0)
        else:
            records.add("sweep", case, "FlexAttention", error="CUDA out of memory")
    records.add("host overhead", {"shape": bench.TINY}, "opgen attention_sink", fwd_us=1.0,
                fwd_bwd_us=2.0)
    records.save()

    sweep = read_sweep(tmp_path / "rows.json")
    points = [dict(zip(bench.CASE_FIELDS, p))["seq_len"] for p in bench.SWEEP]
    assert sweep.xs == tuple(points) and sweep.axis == "seq_len"
    assert list(sweep.lines) == ["opgen attention_sink", "SDPA cuDNN", "FlexAttention"]
    assert [p[0] for p in sweep.lines["opgen attention_sink"].points] == points
    assert sweep.lines["SDPA cuDNN"].label("SDPA cuDNN") == "SDPA cuDNN (n/a: no sinks)"
    assert sweep.lines["FlexAttention"].label("FlexAttention") == f"FlexAttention (n/a at {points[-1]})"
    assert sweep.fixed == "batch=2, heads=32, kv_heads=8, head_dim=128, causal=True"


def run_bench(name: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", f"generated.{name}.bench_{name}", *args],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)


def test_bench_command_line_without_a_gpu():
    """--help works anywhere and names the flags; two tables at once are refused; without CUDA a
    bench says so in one line, whatever its flags."""
    helped = run_bench("rmsnorm", "--help")
    assert helped.returncode == 0, helped.stderr
    for flag in ("--sweep", "--overhead", "--json PATH", "--csv PATH"):
        assert flag in helped.stdout
    assert "rows 256, 1024, 4096, 16384, 65536" in " ".join(helped.stdout.split())
    both = run_bench("rmsnorm", "--sweep", "--overhead")
    assert both.returncode == 2 and "not allowed with argument" in both.stderr
    if not torch.cuda.is_available():
        plain = run_bench("rmsnorm", "--sweep", "--json", "never.json")
        assert plain.returncode == 1 and "needs a CUDA GPU" in plain.stderr
        assert not (REPO_ROOT / "never.json").exists()


def test_generated_bench_imports_neither_opgen_nor_matplotlib():
    code = ("import sys, generated.matmul.bench_matmul; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('opgen', 'matplotlib')))")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_host_rows_take_turns_and_keep_each_best(monkeypatch, tmp_path, capsys):
    """--overhead times the implementations in turn, round after round, and keeps each one's best
    (fwd, eval fwd and fwd+bwd apart): a host whose speed drifts over the run slows every row alike.
    An implementation that raises is reported once and not timed again. Made-up times, no GPU."""
    bench = bench_of("rmsnorm")
    order, rounds = [], {"a": iter([(30, 20, 200), (25, 22, 150), (28, 19, 180)]),
                         "b": iter([(10, 8, 100), (12, 7, 90), (11, 9, 95)])}

    def broken(*inputs):
        raise RuntimeError("no such backend here\nmore")

    def host_round(fn, inputs, grad):
        order.append(fn.__name__)
        if fn is broken:
            fn()
        return next(rounds[fn.__name__])

    def a(*inputs): ...

    def b(*inputs): ...

    fns = {"opgen": a, "eager": b, "compiled": broken, "missing": "n/a: not installed"}
    monkeypatch.setattr(bench, "tiny_case", lambda: (fns, (), None))
    monkeypatch.setattr(bench, "host_round", host_round)
    records = bench.Records(str(tmp_path / "rows.json"))
    bench.host_overhead(records, rounds=3)
    assert order == ["a", "b", "broken", "a", "b", "a", "b"]
    rows = {r["implementation"]: r for r in json.loads((tmp_path / "rows.json").read_text())["rows"]}
    assert (rows["opgen"]["fwd_us"], rows["opgen"]["eval_fwd_us"], rows["opgen"]["fwd_bwd_us"]) == (25, 19, 150)
    assert (rows["eager"]["fwd_us"], rows["eager"]["eval_fwd_us"], rows["eager"]["fwd_bwd_us"]) == (10, 7, 90)
    assert rows["compiled"]["error"] == "no such backend here"
    assert rows["missing"]["error"] == "not installed"
    out = capsys.readouterr().out
    assert "best of 3 rounds taken in turn" in out
    assert "| opgen | 25.0 | 19.0 | 150.0 |" in out and "| compiled | n/a: no such backend here | | |" in out


def test_case_rows_take_turns_and_keep_each_median():
    """A case's implementations are timed in turn, round after round (in_turns): every row
    sees the same drift of the GPU's clock. Each time is the median of its rounds, what bench_one
    returns after the times comes from the last round, an implementation that raises is reported
    with its reason and not timed again, and one that cannot run here (a str) is not called.
    Made-up times, no GPU."""
    bench = bench_of("linear_attention")
    order = []
    rounds = {"a": iter([(3.0, 9.0, "o1"), (1.0, 7.0, "o2"), (2.0, 8.0, "o3")]),
              "b": iter([(5.0, 4.0, "p1"), (6.0, 6.0, "p2"), (4.0, 5.0, "p3")])}

    def a(): ...

    def b(): ...

    def broken(): ...

    def call(fn):
        order.append(fn.__name__)
        if fn is broken:
            raise RuntimeError("no such backend here\nmore")
        return next(rounds[fn.__name__])

    fns = {"opgen": a, "compiled": broken, "eager": b, "missing": "n/a: not installed"}
    results = bench.in_turns(fns, call, rounds=3)
    assert order == ["a", "broken", "b", "a", "b", "a", "b"]
    assert results == {"opgen": (2.0, 8.0, "o3"), "compiled": "no such backend here", "eager": (5.0, 5.0, "p3")}
    assert list(results) == ["opgen", "compiled", "eager"]


@pytest.mark.parametrize("name", ["attention", "linear_attention", "matmul", "rmsnorm", "swiglu"])
def test_every_bench_times_its_cases_in_turns(name):
    """Each family's main() times a case's candidates through in_turns, ROUNDS rounds."""
    source = (REPO_ROOT / "generated" / name / f"bench_{name}.py").read_text()
    main = source[source.index("def main("):]
    assert "results = in_turns(fns, lambda fn: bench_one(" in main
    assert main.count("bench_one(") == 1  # only through in_turns
    assert bench_of(name).ROUNDS == 3
