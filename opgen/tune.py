"""`opgen tune`: time the tilings a spec's rules accept per variant (attention: per (head_dim,
causal, max_window); rmsnorm: per channel count) and write the fastest into the spec as
[[tiling.tuned]], so that the build stays deterministic and the choice is committed and reviewed.

What is common to every family lives here: the candidates (the spec's current tiling first, then
the family's search space, filtered by the spec's own rules and then by the CPU compile check),
picking the winners and editing the spec. The family's Tuner (opgen.families.contract) says what
varies: its keys, search space, rules, the kernel a candidate launches and how it is timed on the
GPU, where each candidate is checked against the package's reference before it is timed.
Selection (pick_winners) and the spec edit (write_tuned) are pure functions. A run interrupted
while timing still writes the variants whose candidates were all timed (timed_variants).
"""

from __future__ import annotations

import contextlib
import difflib
import importlib
import re
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping

from opgen.families import FAMILIES
from opgen.families.contract import Tuner
from opgen.plan import CompileJob

MARKER = "# tuned by opgen tune"


def tuner_of(spec: Any) -> Tuner | None:
    """The spec's family's Tuner, or None where the family has none."""
    return FAMILIES[spec.family].tuner()


@dataclass(frozen=True)
class Candidate:
    key: tuple  # the variant's key, as the family's Tuner.key_fields name it
    phase: str
    tiling: tuple[tuple[str, Any], ...]  # (key, value) pairs as the Tuner dumps them
    label: str = field(default="", compare=False)

    @property
    def variant(self) -> tuple:
        """What a winner is picked per: the key and the phase."""
        return (*self.key, self.phase)

    @property
    def tiling_dict(self) -> dict[str, Any]:
        return dict(self.tiling)


def as_candidate(tuner: Tuner, key: tuple, phase: str, tiling: dict[str, Any]) -> Candidate:
    """The tiling as the package prints it (a default left out), so that a candidate equal to a
    spec's tiling is the same candidate and launches the same kernel."""
    dumped = tuner.dump(phase, tiling)
    return Candidate(tuple(key), phase, tuple(dumped.items()),
                     f"{phase} {tuner.describe(key)} {tuner.describe_tiling(dumped)}")


def candidates(spec: Any, phases: Iterable[str] | None = None,
               max_candidates: int | None = None,
               subset: Mapping[str, Iterable[Any]] | None = None) -> list[Candidate]:
    """Per key of the spec (those whose fields are among subset's values for them, if given)
    and phase: the spec's current tiling first, then the search space's, those the rules
    accept, at most max_candidates of them."""
    tuner = tuner_of(spec)
    phases = tuner.phases if phases is None else tuple(phases)
    found = []
    for key in tuner.chosen_keys(spec, subset):
        for phase in phases:
            mine: list[Candidate] = []
            for tiling in [tuner.current(spec, key, phase), *tuner.space(spec, key, phase)]:
                candidate = as_candidate(tuner, key, phase, tiling)
                if candidate in mine or tuner.problems(spec, key, phase, tiling):
                    continue
                mine.append(candidate)
            found += mine[:max_candidates]
    return found


def compile_job(spec: Any, plan: Any, candidate: Candidate) -> CompileJob:
    """The kernel the candidate launches when it is timed (so that on a GPU the timing loads it
    from TileLang's cache, where the compile check put it)."""
    return tuner_of(spec).compile_job(spec, plan, candidate.key, candidate.phase,
                                      candidate.tiling_dict, candidate.label)


def current_tilings(found: Iterable[Candidate]) -> dict[tuple, Candidate]:
    """Each variant's first candidate: the spec's current tiling for it."""
    current: dict[tuple, Candidate] = {}
    for candidate in found:
        current.setdefault(candidate.variant, candidate)
    return current


def pick_winners(found: Iterable[Candidate], times: dict[Candidate, float | None],
                 min_speedup: float = 1.0) -> dict[tuple, Candidate]:
    """The fastest candidate per variant (key and phase). A candidate without a time (it failed
    to compile, gave a wrong result, or was not run) cannot win; on a tie the earlier one wins.
    A fastest that beats the spec's current tiling by less than min_speedup is timing noise, not
    a reason to change the spec: that variant has no winner and keeps what it had."""
    found = list(found)
    winners: dict[tuple, Candidate] = {}
    for candidate in found:
        ms = times.get(candidate)
        if ms is None:
            continue
        best = winners.get(candidate.variant)
        if best is None or ms < times[best]:
            winners[candidate.variant] = candidate
    current = current_tilings(found)
    return {variant: c for variant, c in winners.items()
            if (gain := speedup(times, current[variant], c)) is None or gain >= min_speedup}


def speedup(times: dict[Candidate, float | None], before: Candidate, after: Candidate
            ) -> float | None:
    """How many times faster `after` ran than `before`; None when `before` has no time."""
    return times[before] / times[after] if times.get(before) else None


def winner_lines(found: Iterable[Candidate], times: dict[Candidate, float | None],
                 min_speedup: float = 1.0) -> list[str]:
    """One line per variant with a time: its fastest, and its speedup over the spec's current
    tiling where that one was timed; a fastest under min_speedup is said to be kept out."""
    found = list(found)
    current = current_tilings(found)
    lines = []
    for variant, c in sorted(pick_winners(found, times).items()):
        line = f"fastest: {c.label} ({times[c]:.3f} ms"
        before = current[variant]
        gain = speedup(times, before, c)
        if before == c:
            line += "; the spec's tiling already"
        elif gain is not None:
            line += f"; the spec's {times[before]:.3f} ms: {gain:.2f}x"
            if gain < min_speedup:
                line += f", under --min-speedup {min_speedup:g}: the spec keeps its tiling"
        lines.append(line + ")")
    return lines


def timed_variants(found: Iterable[Candidate], times: dict[Candidate, float | None]) -> set[tuple]:
    """The variants every candidate of which has a result (a time or None): those a run cut off
    while timing may still pick a winner for."""
    variants: dict[tuple, bool] = {}
    for candidate in found:
        variants[candidate.variant] = variants.get(candidate.variant, True) and candidate in times
    return {v for v, done in variants.items() if done}


def merged_entries(spec: Any, winners: dict[tuple, Candidate]
                   ) -> dict[tuple, dict[str, dict[str, Any]]]:
    """The spec's [[tiling.tuned]] entries with the winners in place: key -> {phase: tiling};
    the phases not tuned now keep their earlier entries."""
    entries = tuner_of(spec).entries(spec)
    for candidate in winners.values():
        entries.setdefault(candidate.key, {})[candidate.phase] = candidate.tiling_dict
    return entries


def stamps_of(winners: Iterable[Candidate], where: str) -> dict[tuple[tuple, str], str]:
    """{(key, phase): where} for each winner: what the entries' markers will say of it, e.g.
    "on NVIDIA H200, 2026-12-05"."""
    return {(c.key, c.phase): where for c in winners}


def marker_line(tuner: Tuner, stamped: Mapping[str, str], entry_phases: Iterable[str]
                ) -> str | None:
    """The comment above an entry with entry_phases: where and when each of its tuned phases was
    tuned ({phase: where}); one clause when every phase of the entry was tuned in one run, a
    clause a tuned phase otherwise (a phase written by hand has none), None when none was."""
    if not stamped:
        return None
    if set(stamped) == set(entry_phases) and len(set(stamped.values())) == 1:
        return f"{MARKER} {next(iter(stamped.values()))}"
    return f"{MARKER}: " + "; ".join(f"{p} {stamped[p]}" for p in tuner.phases if p in stamped)


def read_marker(tuner: Tuner, line: str, entry_phases: Iterable[str]) -> dict[str, str]:
    """{phase: where} from a marker line that marker_line wrote above an entry with
    entry_phases."""
    text = line.strip()[len(MARKER):]
    if not text.startswith(":"):
        return dict.fromkeys(entry_phases, text.strip())
    stamps = {}
    for clause in text[1:].split(";"):
        phase, _, where = clause.strip().partition(" ")
        if phase in tuner.phases and where:
            stamps[phase] = where
    return stamps


def toml_value(value: int | bool) -> str:
    """A tiling value as TOML writes it (a bool is `true`/`false`, not Python's `True`)."""
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def render_tuned(tuner: Tuner, entries: dict[tuple, dict[str, dict[str, Any]]],
                 comments: Mapping[tuple, list[str]]) -> str:
    """[[tiling.tuned]] entries as TOML, sorted by key, each under its comment lines."""
    blocks = []
    for key in sorted(entries):
        lines = [*comments.get(key, []), "[[tiling.tuned]]",
                 *(f"{name} = {toml_value(value)}"
                   for name, value in zip(tuner.key_fields, key, strict=True)
                   if name not in tuner.key_defaults or value != tuner.key_defaults[name])]
        for phase in tuner.phases:
            if (tiling := entries[key].get(phase)) is not None:
                inline = ", ".join(f"{k} = {toml_value(v)}" for k, v in tiling.items())
                lines.append(f"{phase} = {{ {inline} }}")
        blocks.append("\n".join(lines) + "\n")
    return "\n".join(blocks)


_TUNED_HEADER = re.compile(r"^\s*\[\[\s*tiling\s*\.\s*tuned\s*\]\]")
_TILING_HEADER = re.compile(r"^\s*\[{1,2}\s*tiling\s*[.\]]")
_HEADER = re.compile(r"^\s*\[")


def _is_value(line: str) -> bool:
    """A key = value line (not blank, not only a comment, not a table header)."""
    text = line.strip()
    return bool(text) and not text.startswith("#") and not _HEADER.match(line)


def _is_comment(line: str) -> bool:
    return line.lstrip().startswith("#")


def _entry_spans(lines: list[str]) -> list[tuple[int, int, int]]:
    """(first comment line, header, end) of each [[tiling.tuned]] entry in lines. An entry's
    comments are those right above its header; after another entry, every comment line up to
    that one's end (blank lines between them too), so that comments move with their entry."""
    spans: list[tuple[int, int, int]] = []
    for i, line in enumerate(lines):
        if not _TUNED_HEADER.match(line):
            continue
        end = i + 1
        while end < len(lines) and _is_value(lines[end]):
            end += 1
        top = i
        previous_end = spans[-1][2] if spans else None
        if previous_end is not None and all(not lines[k].strip() or _is_comment(lines[k])
                                            for k in range(previous_end, i)):
            top = previous_end
            while top < i and not lines[top].strip():
                top += 1
        else:
            while top > 0 and _is_comment(lines[top - 1]):
                top -= 1
        spans.append((top, i, end))
    return spans


def write_tuned(text: str, tuner: Tuner, entries: dict[tuple, dict[str, dict[str, Any]]],
                stamps: Mapping[tuple[tuple, str], str]) -> str:
    """The spec's text with its [[tiling.tuned]] entries replaced by `entries`; every other line
    as it was. Each entry keeps the comments written above it, and its marker says where and
    when each phase was tuned: stamps[(key, phase)] for the phases tuned now, the earlier marker's
    word for the others (none for a phase written by hand). Without earlier entries the table
    goes after the last [tiling.*] table (else at the end)."""
    lines = text.splitlines(keepends=True)
    spans = _entry_spans(lines)
    written = tomllib.loads(text).get("tiling", {}).get("tuned", []) if spans else []
    comments: dict[tuple, list[str]] = {}
    earlier: dict[tuple[tuple, str], str] = {}
    removed: set[int] = set()
    for (top, header, end), entry in zip(spans, written, strict=True):
        key = tuple(entry.get(f, tuner.key_defaults.get(f)) for f in tuner.key_fields)
        phases = [p for p in tuner.phases if p in entry]
        for k in range(top, header):
            if lines[k].lstrip().startswith(MARKER):
                marked = read_marker(tuner, lines[k], phases)
                earlier.update({(key, p): where for p, where in marked.items()})
            elif lines[k].strip():
                comments.setdefault(key, []).append(lines[k].rstrip("\n"))
        removed.update(range(top, end))
    # Blank lines between two removed entries go with them.
    for i, line in enumerate(lines):
        if not line.strip() and i not in removed:
            before = max((j for j in removed if j < i), default=None)
            after = min((j for j in removed if j > i), default=None)
            if before is not None and after is not None and all(
                    not lines[j].strip() or j in removed for j in range(before, after)):
                removed.add(i)
    for key, phases in entries.items():
        stamped = {p: w for p in phases if (w := stamps.get((key, p), earlier.get((key, p))))}
        marker = marker_line(tuner, stamped, phases)
        if marker is not None:
            comments[key] = [*comments.get(key, []), marker]
    block = render_tuned(tuner, entries, comments) if entries else ""
    if removed and not block and min(removed) > 0 and not lines[min(removed) - 1].strip():
        removed.add(min(removed) - 1)  # the blank line the table was inserted after
    if removed:
        at = min(removed)
        kept = [line for i, line in enumerate(lines) if i not in removed]
        index = at - sum(1 for i in removed if i < at)
        return "".join(kept[:index]) + block + "".join(kept[index:])
    if not block:
        return text
    headers = [i for i, line in enumerate(lines) if _TILING_HEADER.match(line)]
    if headers:
        end = headers[-1]
        for j in range(headers[-1] + 1, len(lines)):
            if _HEADER.match(lines[j]):
                break
            if _is_value(lines[j]):
                end = j
        before, after = lines[:end + 1], lines[end + 1:]
    else:
        before, after = lines, []
    head = "".join(before)
    if head and not head.endswith("\n"):
        head += "\n"
    return head + ("\n" if head else "") + block + "".join(after)


def unified_diff(old: str, new: str, path: str) -> str:
    return "".join(difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True),
                                        f"{path} (before)", f"{path} (tuned)"))


# --- on the GPU: what every family's timing shares ---------------------------------------------


@contextlib.contextmanager
def imported_package(files: dict[str, str], name: str, scratch: Path) -> Iterator[Any]:
    """The rendered package, written under scratch and imported (its autograd module), unloaded
    again on exit: left in sys.modules, it would make the spec's own name check fail (the name
    "shadows an installed module") when the tuned spec is validated."""
    package = scratch / name
    package.mkdir(parents=True, exist_ok=True)
    for rel, text in files.items():
        (package / rel).write_text(text, encoding="utf-8")
    sys.path.insert(0, str(scratch))
    try:
        module = importlib.import_module(f"{name}.autograd")
    finally:
        sys.path.remove(str(scratch))
    try:
        yield module
    finally:
        for loaded in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
            del sys.modules[loaded]


def _max_error(got, want) -> float:
    return (got.float() - want.float()).abs().max().item()


# The run-off after a key's first pass: the spec's current tiling and the fastest few others,
# timed again in turn (see run_off).
RUN_OFF_FINALISTS, RUN_OFF_ROUNDS = 3, 3


def run_off(found: Iterable[Candidate], times: dict[Candidate, float | None],
            retime: Callable[[Candidate], float], finalists: int = RUN_OFF_FINALISTS,
            rounds: int = RUN_OFF_ROUNDS) -> list[Candidate]:
    """Per variant: its current tiling and its `finalists` fastest other candidates, timed again
    in turn for `rounds` rounds, each keeping its best time (into times). The first pass times
    each candidate once, minutes apart from the others; a GPU or host whose speed drifts over
    minutes would otherwise pick by the drift, and the speedup over the current tiling (what
    --min-speedup judges) would compare two different minutes. Returns the candidates re-timed."""
    found = list(found)
    retimed = []
    for variant, first in current_tilings(found).items():
        others = sorted((c for c in found if c.variant == variant and c != first
                         and times.get(c) is not None), key=lambda c: times[c])
        group = ([first] if times.get(first) is not None else []) + others[:finalists]
        if len(group) < 2:
            continue
        for _ in range(rounds):
            for candidate in group:
                times[candidate] = min(times[candidate], retime(candidate))
        retimed += group
    return retimed


def time_by_key(spec: Any, plan: Any, autograd: Any, found: list[Candidate],
                report: Callable[[Candidate, float | None, str], None],
                times: dict[Candidate, float | None],
                calls_at: Callable[[tuple], dict[str, tuple[Callable[[], tuple], tuple, tuple]]]
                ) -> dict[Candidate, float | None]:
    """ms per call of each candidate, into times as they come (a caller still has them when the
    run is interrupted); None for one that failed or was wrong (report says why).

    calls_at(key) makes a key's inputs once and gives, per phase, (call, labels, references):
    call() runs the phase through the package (its outputs in order), each output named by a
    label must match its reference within the spec's tolerance at the bench dtype before the
    call is timed by the package bench's stream_ms (back-to-back calls, the median batch: the
    method of its tables). Each candidate runs with its tiling in the package's base tiling
    constant (its tuned table emptied) and the package's call plans cleared, all restored after.
    After a key's candidates, its run-off (run_off) times the finalists again in turn; report
    shows each finalist's best, with a note."""
    import torch

    tol = spec.test.tolerance_for(spec.bench.dtype)
    bench = importlib.import_module(f"{autograd.__package__}.bench_{spec.name}")
    names = {c.phase: plan.kernels[c.phase].tiling_name for c in found}
    saved = {n: getattr(autograd, n) for p in names.values() for n in (p, p + "S")
             if hasattr(autograd, n)}
    by_key: dict[tuple, list[Candidate]] = {}
    for c in found:
        by_key.setdefault(c.key, []).append(c)

    def restore() -> None:
        """The package as it was: its own tilings, no call plans made with another's."""
        for name, value in saved.items():
            setattr(autograd, name, value)
        # The package's call plans hold the kernels of the tiling they were made with.
        autograd.PLANS.clear()

    def use(candidate: Candidate) -> None:
        """The package set to launch the candidate's tiling."""
        restore()
        setattr(autograd, names[candidate.phase], candidate.tiling_dict)
        if hasattr(autograd, names[candidate.phase] + "S"):
            setattr(autograd, names[candidate.phase] + "S", {})

    try:
        for key, mine in by_key.items():
            # A key's inputs (a backward's saved forward outputs too) come from the package's
            # own tilings, not the last candidate the previous key's run-off left set: that one
            # may not even build at this key's head dim.
            restore()
            calls = calls_at(key)
            for candidate in mine:
                use(candidate)
                try:
                    call, labels, references = calls[candidate.phase]
                    errors = [(label, _max_error(got, want), want.abs().max().item())
                              for label, got, want in zip(labels, call(), references)]
                    wrong = [f"{label} max error {error:.3g}" for label, error, largest in errors
                             if error > tol.atol + tol.rtol * largest]
                    if wrong:
                        times[candidate] = None
                        report(candidate, None, "wrong: " + ", ".join(wrong))
                        continue
                    times[candidate] = bench.stream_ms(call)
                    report(candidate, times[candidate], "")
                except Exception as exc:  # a candidate that fails is dropped, the rest still run
                    times[candidate] = None
                    report(candidate, None, f"failed: {type(exc).__name__}: {exc}".splitlines()[0])

            def retime(candidate: Candidate) -> float:
                use(candidate)
                try:
                    return bench.stream_ms(calls[candidate.phase][0])
                except Exception:  # ran in the first pass: a failure now keeps its first time
                    return float("inf")

            for candidate in run_off(mine, times, retime):
                report(candidate, times[candidate], f"run-off, best of {RUN_OFF_ROUNDS + 1}")
            del calls, retime
            torch.cuda.empty_cache()
    finally:
        restore()
    return times
