"""opgen: generate differentiable TileLang operators from TOML specs (new, list, build, check,
explain, test, bench, plot, tune)."""

from __future__ import annotations

import contextlib
import inspect
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Optional

import typer
from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                           TimeRemainingColumn)
from rich.table import Table

from opgen import __version__
from opgen.errors import CheckFailed, Interrupted, OpgenError, SpecError
from opgen.families import FAMILIES, Family, family_names
from opgen.render import OUT_ROOT, SPEC_FILE, Generated, environment, generate
from opgen.spec import check_identifier, echo, path_for_display

if TYPE_CHECKING:  # imported where used: `opgen check` and `--no-compile` builds need neither
    from opgen.compile import CompileResult
    from opgen.compile_cache import Toolchain

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)
# Wide tables when piped (CI logs, docs); messages never wrapped (one problem, one line).
out = Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True, highlight=False, soft_wrap=True, width=None if sys.stderr.isatty() else 160)
_state = {"debug": False}


def _print_version(value: bool) -> None:
    if value:
        out.print(f"opgen {__version__}")
        raise typer.Exit(0)


@app.callback()
def _main(
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks for errors."),
    version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                 help="Print the version and exit."),
) -> None:
    _state["debug"] = debug
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _terminate_as_interrupt)


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """OpgenError -> its message on stderr and its exit code; a traceback only with --debug."""
    try:
        yield
    except OpgenError as exc:
        if _state["debug"]:
            raise
        err.print(str(exc), markup=False)
        raise typer.Exit(exc.exit_code) from None
    except KeyboardInterrupt:
        if _state["debug"]:
            raise
        err.print("interrupted", markup=False)
        raise typer.Exit(Interrupted.exit_code) from None


def _terminate_as_interrupt(signum, frame) -> None:
    # SIGTERM (a CI timeout, `kill`) cleans up like Ctrl-C: compile workers stopped, nothing half-written.
    raise KeyboardInterrupt


OUT_HELP = ("Output root: packages go to DIR/<name>/ (default: generated/); a directory of "
            "another repository too.")


def _out_root(out: Optional[Path]) -> Path:
    """The output root as shown in messages and recorded nowhere: relative where below the
    working directory."""
    if out is None:
        return OUT_ROOT
    if out.exists() and not out.is_dir():
        raise OpgenError(f"--out: {path_for_display(out)} is not a directory")
    return Path(path_for_display(out))


def _spec_paths(specs: list[Path], out_root: Path = OUT_ROOT) -> list[Path]:
    """The specs named, else specs/*.toml, else the packages' own copies (<out>/*/spec.toml):
    where only vendored packages are at hand, they check and rebuild from those."""
    if specs:
        # The same file named twice (a glob and a path) is built once.
        unique: dict[Path, Path] = {}
        for path in specs:
            unique.setdefault(path.resolve(), path)
        return list(unique.values())
    found = sorted(Path("specs").glob("*.toml")) or sorted(out_root.glob(f"*/{SPEC_FILE}"))
    if not found:
        raise OpgenError(f"no spec given and none found in specs/*.toml or "
                         f"{out_root.as_posix()}/*/{SPEC_FILE}; try `opgen new attention`")
    return found


def _generate_all(specs: list[Path], out_root: Path = OUT_ROOT) -> list[Generated]:
    """Render every spec in memory; report the errors of all files at once."""
    env = environment()
    generated, problems = [], []
    for path in specs:
        try:
            generated.append(generate(path, env, out_root))
        except SpecError as exc:
            problems.append(str(exc))
    owners: dict[str, str] = {}
    for gen in generated:
        if gen.name in owners:
            problems.append(f"{gen.spec_path}: name: '{gen.name}' is also the name in "
                            f"{owners[gen.name]}; each spec needs its own name")
        owners.setdefault(gen.name, gen.spec_path)
    if problems:
        raise OpgenError("\n".join(problems))
    return generated


def scaffolds() -> dict[str, tuple[Family, dict]]:
    """`opgen new` names -> (family, scaffold data)."""
    return {name: (FAMILIES[family], data) for family in family_names()
            for name, data in FAMILIES[family].scaffolds.items()}


@app.command("list")
def list_families() -> None:
    """List the operator families and the scaffolds `opgen new` writes."""
    table = Table("family", "what it generates", box=None)
    for name in family_names():
        table.add_row(name, FAMILIES[name].description)
    out.print(table)
    table = Table("scaffold (opgen new NAME)", "family", "what it is", box=None)
    for name, (family, data) in sorted(scaffolds().items()):
        table.add_row(name, family.name, data["title"])
    out.print(table)


@app.command()
def new(
    scaffold: str = typer.Argument(..., help="Scaffold to start from (see `opgen list`)."),
    name: Optional[str] = typer.Option(None, "--name", help="Operator name (default: the scaffold's)."),
    out_path: Optional[Path] = typer.Option(None, "--out", help="Spec path (default: specs/<name>.toml)."),
) -> None:
    """Write a commented scaffold spec that builds as is."""
    with user_errors():
        known = scaffolds()
        if scaffold not in known:
            raise OpgenError(f"unknown scaffold {echo(scaffold)}; one of: {', '.join(sorted(known))}")
        family, preset = known[scaffold]
        name = scaffold if name is None else name
        try:
            check_identifier(name)
        except ValueError as exc:
            raise OpgenError(f"--name: {exc} (got {echo(name)})") from None
        target = out_path or Path("specs") / f"{name}.toml"
        shown = path_for_display(target)
        text = environment().get_template(family.scaffold_template).render(name=name, preset=preset)
        try:
            blocked = _not_a_directory(target.parent)
            if blocked:
                raise OpgenError(f"{shown}: cannot write it: {blocked} is a file, not a "
                                 "directory; choose another --out")
            target.parent.mkdir(parents=True, exist_ok=True)
            with target.open("x", encoding="utf-8") as file:  # "x": never replaces a file
                file.write(text)
        except FileExistsError:
            raise OpgenError(f"{shown}: already exists; not overwriting it "
                             "(choose another --out or --name)") from None
        except OSError as exc:
            raise OpgenError(f"{shown}: cannot write it ({exc.strerror}); choose another --out") from None
        out.print(f"wrote {shown}\nnext: edit it, then `opgen build {shown}`")


def _not_a_directory(directory: Path) -> str | None:
    """The first of directory and its parents that exists but is not a directory, if any."""
    for path in [*reversed(directory.parents), directory]:
        if path.exists() and not path.is_dir():
            return path_for_display(path)
    return None


@app.command()
def build(
    specs: list[Path] = typer.Argument(None, help="Spec files (default: specs/*.toml)."),
    no_compile: bool = typer.Option(False, "--no-compile", help="Skip the CPU compile check."),
    no_cache: bool = typer.Option(False, "--no-cache", help="Compile every kernel: take no result "
                                  "from the compile cache or from a package manifest's record "
                                  "(the cache is refreshed)."),
    jobs: Optional[int] = typer.Option(None, "--jobs", "-j", help="Compile processes (default: CPUs)."),
    force: bool = typer.Option(False, "--force", help="Replace a package even if another spec (or "
                               "no spec) wrote it."),
    out_dir: Optional[Path] = typer.Option(None, "--out", metavar="DIR", help=OUT_HELP),
) -> None:
    """Validate specs, render generated/<name>/ (or DIR/<name>/), format with black,
    compile-check every kernel."""
    from opgen.compile_cache import check_record
    from opgen.output import ownership_problem, write

    with user_errors():
        started = time.perf_counter()
        out_root = _out_root(out_dir)
        generated = _generate_all(_spec_paths(specs or [], out_root), out_root)
        if not force:
            # Checked before the compile check so the refusal is immediate; write() checks again
            # under the output lock.
            refused = [p for p in (ownership_problem(gen, Path.cwd()) for gen in generated) if p]
            if refused:
                raise OpgenError("\n".join(refused))
        for gen in generated:
            if note := untuned_note(gen.spec_path, gen.spec):
                out.print(note, markup=False)
        rows = {gen.spec_path: [gen.spec_path, "-", "-", "-", "-", "-"] for gen in generated}
        # Compile first, from a scratch copy of each kernels.py: a spec whose kernels do not
        # compile writes nothing, and its last good package stays as it was.
        try:
            checked = None if no_compile else _compile(generated, rows, jobs, not no_cache)
        except KeyboardInterrupt:
            raise Interrupted("interrupted during the compile check; nothing was written") from None
        failures = checked.failures if checked else []
        failed = {f.spec for f in failures}
        done = []
        try:
            for gen in generated:
                if gen.spec_path in failed:
                    rows[gen.spec_path][1:3] = ["0 (compile failed)", "-"]
                    continue
                result = write(gen, Path.cwd(), compile_checked=checked is not None,
                               compiled_with=(check_record(checked.toolchain, gen.plan.compile_jobs)
                                              if checked else None),
                               force=force)
                rows[gen.spec_path][1:3] = [str(result.written), str(result.unchanged)]
                done.append(gen.out_dir.as_posix())
        except KeyboardInterrupt:
            # A package is swapped in whole: each one is either as it was or wholly new.
            raise Interrupted(f"interrupted; written: {', '.join(done) or 'none'}; every other "
                              "package is as it was") from None
        table = Table("spec", "written", "unchanged", "kernels passed", "cached", "compile s",
                      box=None)
        for row in rows.values():
            table.add_row(*row)
        out.print(table)
        out.print(f"done in {time.perf_counter() - started:.1f} s"
                  + (f"; {checked.summary()}" if checked else ""))
        if failures:
            for failure in failures:
                err.print(failure.message(), markup=False)
            raise CheckFailed(
                f"{sum(len(f.labels) for f in failures)} kernel(s) failed the compile check; "
                f"nothing written for {', '.join(sorted(failed))}"
            )


def untuned_note(spec_path: str, spec: Any) -> str | None:
    """The note of a spec with variants no [[tiling.tuned]] entry serves (a head dim added to a
    scaffold, say): their calls run the base tiling, which is far from the fastest on Hopper."""
    tuner = FAMILIES[spec.family].tuner()
    untuned = tuner.untuned(spec) if tuner else []
    if not untuned:
        return None
    # The subset options that narrow the tune to these keys (those that narrow it at all).
    options = []
    for option, (field, _) in tuner.subset_options.items():
        i = tuner.key_fields.index(field)
        values = list(dict.fromkeys(key[i] for key in untuned))
        if len(values) < len(tuner.subset_values(spec, field)):
            options.append(f" {option} {','.join(str(v) for v in values)}")
    return (f"note: {spec_path}: no [[tiling.tuned]] entry serves "
            f"{', '.join(tuner.describe(key) for key in untuned)}; those calls run the base "
            f"tiling. On a Hopper GPU, `opgen tune {spec_path}{''.join(options)}` times the "
            "candidates and writes the fastest.")


# TileLang's words when a tile and the threads of its phase have no common fragment layout.
LAYOUT_CONFLICT = "Layout infer conflict"


@dataclass(frozen=True)
class CompileFailure:
    """The kernel instances of one factory that failed with one error."""

    spec: str
    factory: str
    section: str  # the spec's tiling section of that kernel
    error: str
    labels: tuple[str, ...]

    def message(self) -> str:
        shown = ", ".join(self.labels[:3]) + (f", and {len(self.labels) - 3} more"
                                               if len(self.labels) > 3 else "")
        text = (f"{self.spec}: kernel {self.factory} failed the compile check in "
                f"{len(self.labels)} variant(s) ({shown}):\n  " + self.error.replace("\n", "\n  "))
        if LAYOUT_CONFLICT in self.error:
            text += (f"\n  hint: the tile sizes and threads of {self.section} do not fit one "
                     "another in TileLang's layout inference (for example 64 rows over 256 "
                     f"threads); change {self.section}.threads or its block sizes")
        return text


@dataclass(frozen=True)
class CompileCheck:
    """What the compile check of one build found, kernel by kernel."""

    results: list[CompileResult]
    failures: list[CompileFailure]
    toolchain: Toolchain

    def summary(self) -> str:
        source = Counter(r.source for r in self.results)
        identical = (f" (and {source['identical']} the same kernel as one of those)"
                     if source["identical"] else "")
        return (f"{len(self.results)} kernel(s) checked: {source['compiled']} compiled{identical}, "
                f"{source['cache']} from the compile cache, {source['manifest']} from package "
                "manifests")


def _compile(generated: list[Generated], rows: dict[str, list[str]], jobs: Optional[int],
             use_cache: bool) -> CompileCheck:
    from opgen.compile import CompileResult
    from opgen.compile_cache import ResultCache, check_record, job_key, toolchain
    from opgen.output import recorded_compile_check

    tools = toolchain()
    cache = ResultCache(warn=lambda message: err.print(message, markup=False))
    jobs_of = [(gen, i, job) for gen in generated for i, job in enumerate(gen.plan.compile_jobs)]
    keys = {(gen.spec_path, i): job_key(gen.files["kernels.py"], job, tools)
            for gen, i, job in jobs_of}
    # A package whose manifest records a pass of these very kernels with this toolchain needs
    # no compile (a fresh clone builds in seconds); other jobs may have a pass in the cache.
    recorded = {gen.spec_path for gen in generated
                if use_cache and recorded_compile_check(gen, Path.cwd())
                == check_record(tools, gen.plan.compile_jobs)}
    known: dict[tuple[str, int], CompileResult] = {}
    for gen, i, job in jobs_of:
        if gen.spec_path in recorded:
            known[gen.spec_path, i] = CompileResult(gen.spec_path, job.label, True, 0.0,
                                                    source="manifest")
        elif use_cache and (hit := cache.get(keys[gen.spec_path, i], gen.spec_path, job.label)):
            known[gen.spec_path, i] = hit
    pending = [(gen, i, job) for gen, i, job in jobs_of if (gen.spec_path, i) not in known]
    with _CheckProgress(generated, known.values(), len(pending)) as progress:
        for (gen, i, _), result in zip(pending, _compile_jobs(pending, jobs, progress.done),
                                       strict=True):
            cache.put(keys[gen.spec_path, i], result, tools)
            known[gen.spec_path, i] = result
    results = [known[gen.spec_path, i] for gen, i, _ in jobs_of]
    for gen in generated:
        mine = [r for r in results if r.spec == gen.spec_path]
        rows[gen.spec_path][3] = f"{sum(r.ok for r in mine)}/{len(mine)}"
        rows[gen.spec_path][4] = str(sum(r.cached for r in mine))
        rows[gen.spec_path][5] = f"{_compile_seconds(mine):.1f}"
    sections = {(gen.spec_path, k.factory): f"tiling.{key}"
                for gen in generated for key, k in gen.plan.kernels.items()}
    grouped: dict[tuple[str, str, str], list[str]] = {}
    for (_, _, job), result in zip(jobs_of, results, strict=True):
        if not result.ok:
            grouped.setdefault((result.spec, job.factory, result.error), []).append(result.label)
    failures = [CompileFailure(spec, factory, sections.get((spec, factory), "tiling"), error,
                               tuple(labels))
                for (spec, factory, error), labels in grouped.items()]
    return CompileCheck(results, failures, tools)


def _compile_jobs(pending, jobs: Optional[int], on_done) -> list[CompileResult]:
    """Compile (Generated, index, job) triples from a scratch copy of each kernels.py."""
    from opgen.compile import compile_all, scratch_dir

    if not pending:
        return []
    with scratch_dir() as scratch:
        paths: dict[str, Path] = {}
        for gen, _, _ in pending:
            if gen.name not in paths:
                paths[gen.name] = Path(scratch) / gen.name / "kernels.py"
                paths[gen.name].parent.mkdir()
                paths[gen.name].write_text(gen.files["kernels.py"], encoding="utf-8")
        work = [(gen.spec_path, paths[gen.name], job) for gen, _, job in pending]
        return compile_all(work, workers=jobs, on_done=on_done)


class _CheckProgress:
    """The compile check's progress on stdout. On a terminal, a live bar with the spec and an ETA;
    elsewhere (CI, `| tee`) one line per spec as its last kernel is done, so a log shows progress."""

    def __init__(self, generated: list[Generated], known: Iterable[CompileResult],
                 to_compile: int):
        self.total = {gen.spec_path: len(gen.plan.compile_jobs) for gen in generated}
        self.done_of: dict[str, list[CompileResult]] = {spec: [] for spec in self.total}
        self.started = time.perf_counter()
        self.bar = None
        if out.is_terminal and to_compile:
            # ETA from the whole run: kernels take seconds to a minute each, in bursts.
            self.bar = Progress(TextColumn("compile check (sm_90a)"), BarColumn(),
                                MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("ETA"),
                                TimeRemainingColumn(), TextColumn("{task.description}"),
                                console=out, speed_estimate_period=3600)
            self.task = self.bar.add_task("", total=to_compile)
        for result in known:
            self.done(result)

    def __enter__(self) -> "_CheckProgress":
        if self.bar:
            self.bar.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.bar:
            self.bar.stop()

    def done(self, result: CompileResult) -> None:
        mine = self.done_of[result.spec]
        mine.append(result)
        if self.bar:
            if not result.cached:
                self.bar.update(self.task, advance=1,
                                description=f"{result.spec} {len(mine)}/{self.total[result.spec]}")
        elif len(mine) == self.total[result.spec]:
            elapsed = int(time.perf_counter() - self.started)
            out.print(f"compile check: {result.spec} {sum(r.ok for r in mine)}/{len(mine)} "
                      f"passed, {sum(r.cached for r in mine)} cached, "
                      f"{_compile_seconds(mine):.1f} s compiling, "
                      f"{elapsed // 60}:{elapsed % 60:02d} elapsed", markup=False)


def _compile_seconds(results: Iterable[CompileResult]) -> float:
    """Seconds this build spent compiling (a cached result took none)."""
    return sum(r.seconds for r in results if not r.cached)


@app.command()
def check(
    specs: list[Path] = typer.Argument(None, help="Spec files (default: specs/*.toml)."),
    require_compiled: bool = typer.Option(
        False, "--require-compiled",
        help="Also fail when a package was built with --no-compile (its kernels never compiled).",
    ),
    out_dir: Optional[Path] = typer.Option(None, "--out", metavar="DIR", help=OUT_HELP),
) -> None:
    """Exit 1 when generated/ (or DIR) is out of step with specs/ (stale, hand-edited, missing,
    extra, corrupt manifest, leftovers of an interrupted build). Without specs/ it checks each
    package against its own spec.toml."""
    from opgen.output import diff, project_drifts

    with user_errors():
        out_root = _out_root(out_dir)
        paths = _spec_paths(specs or [], out_root)
        generated = _generate_all(paths, out_root)
        problems = []
        for gen in generated:
            for drift in diff(gen, Path.cwd(), require_compiled=require_compiled):
                problems.append(drift.message(gen.spec_path))
                if drift.diff:
                    problems.append(drift.diff)
        if not specs:
            # Checking the whole project: whatever in generated/ no spec builds is reported too.
            known = {gen.name for gen in generated}
            problems += [drift.message()
                         for drift in project_drifts(Path.cwd(), known, out_root)]
        where = f"{out_root.as_posix()}/"
        if problems:
            out.print("\n".join(problems), markup=False)
            raise CheckFailed(f"{where} is out of step with the specs; run `opgen build` "
                              "(hand edits belong in the spec or in opgen's templates)")
        out.print(f"{where} matches {len(generated)} spec(s)")


@app.command()
def explain(
    spec: Path = typer.Argument(..., help="Spec file."),
    shape: Optional[str] = typer.Option(
        None, "--shape",
        help="Runtime shape as key=value pairs, e.g. m=4096,n=4096,k=4096 (default: the first "
             "bench shape). Keys: " + "; ".join(f"{name} {FAMILIES[name].shape_usage}"
                                               for name in family_names()) + ".",
    ),
) -> None:
    """Print the plan: kernels and grids, saved bytes, atomic and split buffers, FLOPs."""
    from opgen.render import load_plan

    with user_errors():
        plan, family = load_plan(spec)
        values = _parse_shape(shape, family.shape_keys, family.required_shape_keys) if shape else \
            plan.bench.shapes[0].model_dump() | {"dtype": plan.bench.dtype}
        out.print(f"{plan.source.spec_path}: {plan.family} '{plan.name}'", markup=False)
        for title, rows in family.explain(plan, values):
            out.print(f"\n[bold]{title}[/bold]")
            if rows:
                table = Table(*rows[0], box=None)
                for row in rows[1:]:
                    table.add_row(*row)
                out.print(table)


def _parse_shape(text: str, keys: tuple[str, ...], required: tuple[str, ...]) -> dict:
    values: dict = {}
    for part in text.split(","):
        key, sep, raw = part.partition("=")
        key = key.strip()
        if not sep or key not in keys:
            raise OpgenError(f"--shape: expected key=value with keys {', '.join(keys)} (got {echo(part)})")
        if key == "dtype":
            values[key] = raw.strip()
        elif key == "causal":
            flag = raw.strip().lower()
            if flag not in ("0", "1", "true", "false"):
                raise OpgenError(f"--shape: causal must be 0, 1, true or false (got {echo(raw)})")
            values[key] = flag in ("1", "true")
        else:
            try:
                values[key] = int(raw)
            except ValueError:
                raise OpgenError(f"--shape: {key} must be an integer (got {echo(raw)})") from None
    missing = [k for k in required if k not in values]
    if missing:
        raise OpgenError(f"--shape: missing {', '.join(missing)}")
    return values


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def test(ctx: typer.Context, name: str = typer.Argument(..., help="Operator name."),
         out_dir: Optional[Path] = typer.Option(None, "--out", metavar="DIR", help=OUT_HELP),
         allow_skip: bool = typer.Option(False, "--allow-skip",
                                         help="Exit 0 even when the GPU tests skip (no CUDA).")
         ) -> None:
    """Run the generated tests of generated/<name>/ (needs a CUDA GPU). Extra args go to pytest.

    Without CUDA the GPU tests skip, and the run exits 1 saying that no GPU test ran, unless
    --allow-skip."""
    with user_errors():
        package = _package(name, _out_root(out_dir))
        # pytest imports the test module as <name>.test_<name> (or under the packages above it
        # when DIR is itself a package), with the first directory above it that is no package on
        # sys.path: its relative imports work wherever DIR is.
        plugin = [] if allow_skip else ["-p", "opgen.pytest_gpu_required"]
        cmd = [sys.executable, "-m", "pytest", *plugin, str(package), *ctx.args]
        raise typer.Exit(subprocess.call(cmd))


@app.command()
def bench(name: str = typer.Argument(..., help="Operator name."),
          out_dir: Optional[Path] = typer.Option(None, "--out", metavar="DIR", help=OUT_HELP),
          sweep: bool = typer.Option(False, "--sweep", help="Time the plan's sweep of sequence "
                                     "lengths (or sizes) instead of the spec's \\[bench] shapes."),
          overhead: bool = typer.Option(False, "--overhead",
                                        help="Only the host time per call at a tiny shape."),
          json_path: Optional[Path] = typer.Option(None, "--json", metavar="PATH",
                                                   help="Also write every row printed to PATH "
                                                        "as JSON."),
          csv_path: Optional[Path] = typer.Option(None, "--csv", metavar="PATH",
                                                  help="Also write every row printed to PATH "
                                                       "as CSV."),
          plot_path: Optional[Path] = typer.Option(None, "--plot", metavar="PNG",
                                                   help="Run the sweep, write its JSON beside "
                                                        "PNG (PNG's name with .json, or --json "
                                                        "PATH), then draw it (needs matplotlib: "
                                                        "pip install 'opgen\\[plot]')."),
          ) -> None:
    """Run the generated benchmark of generated/<name>/ (needs a CUDA GPU)."""
    with user_errors():
        package = _package(name, _out_root(out_dir))
        if overhead and (sweep or plot_path):
            raise OpgenError(f"--overhead times no sweep: drop it or {'--plot' if plot_path else '--sweep'}")
        if plot_path is not None:
            from opgen.plot import figure_class, plot_sweep

            figure_class()  # without matplotlib: say so now, not after the benchmark
            sweep, json_path = True, json_path or plot_path.with_suffix(".json")
            if json_path.resolve() == plot_path.resolve():
                raise OpgenError(f"--plot: {plot_path.as_posix()} would be the JSON too; give it "
                                 "another suffix (.png) or --json another path")
        flags = [*(["--sweep"] if sweep else []), *(["--overhead"] if overhead else []),
                 *(["--json", str(json_path)] if json_path else []),
                 *(["--csv", str(csv_path)] if csv_path else [])]
        # `python -m <name>.bench_<name>` with DIR first on the path: the package imports itself
        # by its own name, whatever DIR is.
        path = os.environ.get("PYTHONPATH")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(package.parent.resolve()), *([path] if path else [])])}
        status = subprocess.call([sys.executable, "-m", f"{name}.bench_{name}", *flags], env=env)
        if status != 0 or plot_path is None:
            raise typer.Exit(status)
        plot_sweep(json_path, plot_path)
        out.print(f"wrote {plot_path.as_posix()} from {json_path.as_posix()}")


@app.command()
def plot(rows: Path = typer.Argument(..., metavar="ROWS.json",
                                     help="A bench's JSON, from --sweep --json PATH."),
         image: Path = typer.Argument(..., metavar="OUT.png",
                                      help="The plot to write (PNG; another suffix, another "
                                           "format matplotlib writes: .svg, .pdf).")) -> None:
    """Draw a bench's sweep (its --json file): fwd and bwd throughput, one line per implementation.

    Needs matplotlib: pip install 'opgen\\[plot]'."""
    from opgen.plot import plot_sweep

    with user_errors():
        plot_sweep(rows, image)
        out.print(f"wrote {image.as_posix()} from {rows.as_posix()}")

@app.command()
def tune(
    spec_path: Path = typer.Argument(..., metavar="SPEC", help="Spec file (attention or rmsnorm family)."),
    phases: str = typer.Option("fwd,bwd", "--phases", help="Phases to tune: fwd, bwd or both."),
    dry_run: bool = typer.Option(False, "--dry-run", help="List the candidates that pass the "
                                 "spec's rules and the compile check; time nothing, write nothing."),
    max_candidates: Optional[int] = typer.Option(None, "--max-candidates", min=1, help="At most N "
                                                 "candidates per variant and phase, the spec's "
                                                 "current tiling first."),
    jobs: Optional[int] = typer.Option(None, "--jobs", "-j", help="Compile processes (default: CPUs)."),
    head_dims: Optional[str] = typer.Option(None, "--head-dims", help="attention: tune only these "
                                            "of the spec's head dims (comma-separated); the "
                                            "others keep their entries."),
    windows: Optional[str] = typer.Option(None, "--windows", help="attention: tune only the "
                                          "variants of these sliding windows of the bench shapes "
                                          "(comma-separated; 0: calls of any window or none); "
                                          "the others keep their entries."),
    channels: Optional[str] = typer.Option(None, "--channels", help="rmsnorm: tune only these of "
                                           "the bench shapes' channel counts (comma-separated); "
                                           "the others keep their entries."),
    min_speedup: float = typer.Option(1.03, "--min-speedup", min=1.0, help="Write a variant's "
                                      "fastest only where it beats the spec's current tiling by "
                                      "this factor (interleaved rounds on one H200 differ by "
                                      "1-3 percent: a smaller gain is noise)."),
) -> None:
    """Time the fwd/bwd tilings the spec's rules accept per variant (attention: per (head_dim,
    causal), and per bench window of a sliding-window spec; rmsnorm: per bench channel count)
    on this GPU and write the fastest into the spec's tiling.tuned table (a diff is printed).
    Each candidate is compile-checked, then checked against the reference before it is timed.
    Without a GPU (or with --dry-run) it lists the candidates and writes nothing. Exit 1 when no
    candidate is left."""
    import datetime
    import tomllib

    from opgen import tune as tuning
    from opgen.compile import compile_all, scratch_dir
    from opgen.spec import SpecSource, read_spec, validate

    with user_errors():
        gen = generate(spec_path)
        plan, family = gen.plan, FAMILIES[gen.plan.family]
        tunable = sorted(name for name, f in FAMILIES.items() if f.tuner_module)
        if not family.tuner_module:
            raise OpgenError(f"{plan.source.spec_path}: family: opgen tune supports the "
                             f"{' and '.join(tunable)} families (got {echo(family.name)})")
        tuner = family.tuner()
        chosen = tuple(p.strip() for p in phases.split(",") if p.strip())
        if not chosen or any(p not in tuner.phases for p in chosen):
            raise OpgenError(f"--phases: a comma-separated list of {', '.join(tuner.phases)} "
                             f"(got {echo(phases)})")
        source = read_spec(spec_path)
        spec = validate(family.spec, source)
        subset = {}
        for option, given in (("--head-dims", head_dims), ("--windows", windows),
                              ("--channels", channels)):
            if given is None:
                continue
            if option not in tuner.subset_options:
                raise OpgenError(f"{option}: not an option of the {family.name} family's tuning "
                                 f"(it takes {' and '.join(tuner.subset_options)})")
            field, noun = tuner.subset_options[option]
            allowed = tuner.subset_values(spec, field)
            words = [w.strip() for w in given.split(",") if w.strip()]
            if not words or any(not w.isdigit() or int(w) not in allowed for w in words):
                raise OpgenError(f"{option}: a comma-separated list of {noun} "
                                 f"{echo(list(allowed))} (got {echo(given)})")
            subset[field] = {int(w) for w in words}
        found = tuning.candidates(spec, [p for p in tuner.phases if p in chosen], max_candidates,
                                  subset)
        out.print(f"{plan.source.spec_path}: {len(found)} candidate(s) pass the spec's rules; "
                  "compile check (sm_90a)...", markup=False)
        started = time.monotonic()
        with scratch_dir() as scratch:
            kernels_path = Path(scratch) / "kernels.py"
            kernels_path.write_text(gen.files["kernels.py"], encoding="utf-8")
            results = compile_all(
                [(plan.source.spec_path, kernels_path, tuning.compile_job(spec, plan, c)) for c in found],
                workers=jobs, keep_cache=True)
        compiled = [c for c, r in zip(found, results, strict=True) if r.ok]
        table = Table(*tuner.key_fields, "phase", "tiling", "compile", box=None)
        for c, r in zip(found, results, strict=True):
            table.add_row(*(tuning.toml_value(v) for v in c.key), c.phase,
                          tuner.describe_tiling(c.tiling_dict),
                          ("ok (TileLang's cache)" if r.cached else
                           f"ok, {r.smem_bytes // 1024} KB smem") if r.ok else
                          "failed: " + r.error.splitlines()[-1][:80])
        out.print(table)
        out.print(f"{len(compiled)} of {len(found)} compile ({time.monotonic() - started:.0f} s)",
                  markup=False)
        if not compiled:
            raise CheckFailed("no candidate passed the compile check")
        import torch

        if dry_run or not torch.cuda.is_available():
            why = "--dry-run" if dry_run else "no CUDA GPU here"
            out.print(f"{len(compiled)} candidate(s) compile; timing them needs a GPU ({why}): "
                      "nothing written", markup=False)
            return
        gpu = torch.cuda.get_device_name()
        if torch.cuda.get_device_capability() == (9, 0):
            from opgen.compile import TARGET

            # The compile check's target: its kernels come from TileLang's cache.
            os.environ.setdefault("TILELANG_DEFAULT_TARGET", TARGET)

        def report(c, ms, note):
            # note: why a candidate has no time, or what a time is (a run-off's best). The
            # elapsed time shows what a run under a time limit can expect to finish.
            shown = note if ms is None else f"{ms:.3f} ms" + (f" ({note})" if note else "")
            out.print(f"  {c.label}: {shown}  [{time.monotonic() - started:.0f} s]", markup=False)

        times: dict = {}
        cut_off = False
        try:
            with scratch_dir() as scratch, tuning.imported_package(gen.files, spec.name,
                                                                   Path(scratch)) as autograd:
                tuner.time_candidates(spec, plan, autograd, compiled, report,
                                      jobs or os.cpu_count() or 1, times)
        except KeyboardInterrupt:
            # Ctrl-C or a time limit while timing: the variants timed in full keep their winners.
            cut_off = True
        complete = tuning.timed_variants(compiled, times)
        timed = [c for c in compiled if c.variant in complete]
        winners = tuning.pick_winners(timed, times, min_speedup)
        if cut_off and not complete:
            raise Interrupted("interrupted while timing, before any variant had all its "
                              "candidates timed; nothing written")
        if not tuning.pick_winners(timed, times):
            raise CheckFailed("no candidate gave the reference's result; nothing written")
        for line in tuning.winner_lines(timed, times, min_speedup):
            out.print(line, markup=False)
        where = f"on {gpu}, {datetime.date.today().isoformat()}"
        stamps = tuning.stamps_of(winners.values(), where)
        text = tuning.write_tuned(source.text, tuner, tuning.merged_entries(spec, winners), stamps)
        validate(family.spec, SpecSource(source.path, "", tomllib.loads(text), text))
        if text == source.text:
            out.print(f"{source.path}: unchanged", markup=False)
        else:
            out.print(tuning.unified_diff(source.text, text, source.path), markup=False, end="")
            temp = spec_path.with_name(spec_path.name + ".tune-tmp")
            temp.write_text(text, encoding="utf-8")
            os.replace(temp, spec_path)
            out.print(f"wrote {source.path}; next: `opgen build {source.path}`", markup=False)
        if cut_off:
            untimed = sorted({c.variant for c in compiled} - complete)
            raise Interrupted("interrupted while timing; wrote the winners of the variants timed "
                              "in full; not timed in full (kept as they were): "
                              + ", ".join(f"{tuner.describe(v[:-1])} {v[-1]}" for v in untimed))


def _package(name: str, out_root: Path = OUT_ROOT) -> Path:
    package = out_root / name
    if not (package / "__init__.py").is_file():
        raise OpgenError(f"{package.as_posix()}/ does not exist; run `opgen build` first")
    return package


# Typer lists each command beside its docstring's first paragraph with the docstring's line breaks
# kept (mid-sentence on a terminal); that paragraph as one line reads as the command's own help.
for _command in app.registered_commands:
    if _command.short_help is None and _command.callback.__doc__:
        _command.short_help = " ".join(inspect.cleandoc(_command.callback.__doc__)
                                       .split("\n\n")[0].split())
