"""`opgen plot` and `opgen bench --plot` on the CPU: a small sweep JSON drawn into a PNG, the
error without matplotlib, bad JSON, and the bench command's flags."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from conftest import REPO_ROOT

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def sweep_json(path: Path, *, errors: bool = True) -> Path:
    """A bench's --sweep --json file, small: two implementations over three sequence lengths, a
    third that never ran, and a host-overhead row the plot leaves out."""
    rows = []
    for i, seq_len in enumerate((1024, 2048, 4096)):
        case = {"batch": 2, "heads": 8, "kv_heads": 8, "seq_len": seq_len, "head_dim": 64,
                "causal": True, "window": None}
        for name, speed in (("opgen x", 300.0), ("FlexAttention", 250.0)):
            rows.append({"table": "sweep", "case": case, "implementation": name, "fwd_ms": 1.0,
                         "fwd_throughput": speed + 10 * i, "bwd_ms": 2.0,
                         "bwd_throughput": speed / 2 + 10 * i, "unit": "TFLOP/s", "error": None})
        if errors:
            rows.append({"table": "sweep", "case": case, "implementation": "SDPA cuDNN",
                         "error": "no sinks"})
    rows.append({"table": "host overhead", "case": {"shape": "tiny"}, "implementation": "opgen x",
                 "fwd_us": 50.0, "fwd_bwd_us": 200.0, "error": None})
    data = {"package": "x", "dtype": "bfloat16", "unit": "TFLOP/s",
            "sweep": {"axis": "seq_len", "label": "sequence length"}, "torch": "2.13.0",
            "tilelang": "0.1.15", "gpu": "NVIDIA H200", "date": "2026-12-01T12:00:00+00:00",
            "argv": ["--sweep", "--json", path.name], "rows": rows}
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


@pytest.fixture
def no_matplotlib(monkeypatch):
    """matplotlib made unimportable, as on a machine without it (the GPU machine)."""
    for name in [m for m in sys.modules if m.split(".")[0] == "matplotlib"]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises ImportError


def test_plot_draws_a_png(project, cli):
    pytest.importorskip("matplotlib", reason="matplotlib is not installed: pip install 'opgen[plot]'")
    sweep_json(project / "rows.json")
    result = cli("plot", "rows.json", "out.png")
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == "wrote out.png from rows.json"
    image = (project / "out.png").read_bytes()
    assert image.startswith(PNG_SIGNATURE) and len(image) > 10_000
    again = cli("plot", "rows.json", "again.png")
    assert again.exit_code == 0 and (project / "again.png").read_bytes() == image, "deterministic"


def test_plot_without_matplotlib_says_what_to_install(project, cli, no_matplotlib):
    result = cli("plot", sweep_json(project / "rows.json"), "out.png")
    assert result.exit_code == 1
    assert result.stderr == "opgen plot: matplotlib is not installed; pip install 'opgen[plot]'\n"
    assert not (project / "out.png").exists()


def test_bench_plot_without_matplotlib_fails_before_the_benchmark(repo_root, cli, no_matplotlib,
                                                                 monkeypatch):
    ran = []
    monkeypatch.setattr("opgen.cli.subprocess.call", lambda *a, **k: ran.append(a) or 0)
    result = cli("bench", "rmsnorm", "--plot", "out.png")
    assert result.exit_code == 1
    assert result.stderr == "opgen plot: matplotlib is not installed; pip install 'opgen[plot]'\n"
    assert ran == [], "the benchmark did not run"


@pytest.mark.parametrize("text, message", [
    ("{", "not valid JSON"),
    ('{"rows": []}', "not the JSON of a bench's --sweep --json run (KeyError: 'sweep')"),
    (json.dumps({"sweep": {"axis": "seq_len", "label": "s"}, "rows": [
        {"table": "shapes", "case": {}, "implementation": "a"}]}),
     "no sweep rows; write them with `opgen bench NAME --sweep --json rows.json`"),
])
def test_plot_of_bad_json_says_what_is_wrong(project, cli, text, message):
    pytest.importorskip("matplotlib", reason="matplotlib is not installed: pip install 'opgen[plot]'")
    (project / "rows.json").write_text(text)
    result = cli("plot", "rows.json", "out.png")
    assert result.exit_code == 2
    assert result.stderr.startswith(f"rows.json: {message}"), result.stderr
    assert not (project / "out.png").exists()
    missing = cli("plot", "nope.json", "out.png")
    assert missing.exit_code == 2 and missing.stderr.startswith("nope.json: cannot read it")


def test_bench_plot_runs_the_sweep_then_draws_it(repo_root, cli, monkeypatch, tmp_path):
    """--plot runs the package's bench with --sweep --json beside the PNG, then plots that JSON
    (the bench's run is faked: it writes the JSON as the real one would)."""
    pytest.importorskip("matplotlib", reason="matplotlib is not installed: pip install 'opgen[plot]'")
    commands = []

    def fake_bench(cmd, env):
        commands.append(cmd)
        sweep_json(Path(cmd[cmd.index("--json") + 1]))
        return 0

    monkeypatch.setattr("opgen.cli.subprocess.call", fake_bench)
    png = tmp_path / "attention.png"
    result = cli("bench", "attention", "--plot", png)
    assert result.exit_code == 0, result.output
    assert commands == [[sys.executable, "-m", "attention.bench_attention", "--sweep", "--json",
                         str(tmp_path / "attention.json")]]
    assert png.read_bytes().startswith(PNG_SIGNATURE)
    assert f"wrote {png.as_posix()} from {(tmp_path / 'attention.json').as_posix()}" in result.stdout


def test_bench_passes_its_flags_on_and_stops_on_a_failed_run(repo_root, cli, monkeypatch):
    commands = []
    monkeypatch.setattr("opgen.cli.subprocess.call", lambda cmd, env: commands.append(cmd[3:]) or 1)
    assert cli("bench", "matmul", "--sweep", "--json", "m.json").exit_code == 1
    assert cli("bench", "matmul", "--overhead").exit_code == 1
    assert cli("bench", "matmul", "--csv", "m.csv").exit_code == 1
    assert cli("bench", "matmul", "--plot", "m.png").exit_code == 1  # the run failed: no plot
    assert commands == [["--sweep", "--json", "m.json"], ["--overhead"], ["--csv", "m.csv"],
                        ["--sweep", "--json", "m.json"]]
    assert not (REPO_ROOT / "m.png").exists()


@pytest.mark.parametrize("args, message", [
    (("--overhead", "--sweep"), "--overhead times no sweep: drop it or --sweep"),
    (("--overhead", "--plot", "o.png"), "--overhead times no sweep: drop it or --plot"),
    (("--plot", "o.json"), "--plot: o.json would be the JSON too"),
])
def test_bench_refuses_flags_that_do_not_go_together(repo_root, cli, args, message):
    if "--plot" in args:
        pytest.importorskip("matplotlib", reason="--plot checks for matplotlib first")
    result = cli("bench", "matmul", *args)
    assert result.exit_code == 2
    assert result.stderr.startswith(message), result.stderr


def test_help_lists_the_bench_flags_and_plot(cli):
    bench = cli("bench", "--help")
    assert bench.exit_code == 0
    for flag in ("--sweep", "--overhead", "--json", "--csv", "--plot", "--out"):
        assert flag in bench.stdout
    assert "pip install 'opgen[plot]'" in bench.stdout
    top = cli("--help")
    assert "plot" in top.stdout and "Draw a bench's sweep" in top.stdout
