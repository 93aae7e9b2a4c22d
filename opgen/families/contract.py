"""The family contract: what a family declares once, as its module's FAMILY."""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

from pydantic import BaseModel

from opgen.plan import PlanBase, SourceInfo, Table, tuned_tables
from opgen.spec import DEFAULT_TOLERANCES, SpecBase, Tolerance

# Output file -> template in the family's folder; "{name}" is the spec's name.
OUTPUT_TEMPLATES = {
    "__init__.py": "__init__.py.jinja",
    "kernels.py": "kernels.py.jinja",
    "autograd.py": "autograd.py.jinja",
    "modules.py": "modules.py.jinja",
    "reference.py": "reference.py.jinja",
    "test_{name}.py": "test_op.py.jinja",
    "bench_{name}.py": "bench_op.py.jinja",
}


@dataclass(frozen=True)
class Family:
    """A family: its spec model (whose `family` names it), plan and explain functions and
    scaffolds, one line for `opgen list`, and the keys `explain --shape` accepts. Its templates
    are in templates/<name>/, one per output file."""

    spec: type[SpecBase]
    plan: Callable[[Any, SourceInfo], PlanBase]
    explain: Callable[[Any, dict[str, Any]], list[Table]]  # (plan, runtime shape) -> tables
    scaffolds: Mapping[str, dict[str, Any]]  # `opgen new <scaffold>`: the data each renders from
    description: str
    shape_keys: tuple[str, ...]  # in the order `explain --shape` lists them
    optional_shape_keys: tuple[str, ...] = ("dtype",)
    # Output files of this family only, beside OUTPUT_TEMPLATES (file -> template in its folder).
    extra_outputs: Mapping[str, str] = field(default_factory=dict)
    # `opgen tune` for this family: the module whose TUNER is its Tuner, imported on use (a tuner
    # imports the family module, and builds need none). None: the family has no tuned tilings.
    tuner_module: str | None = None

    @property
    def name(self) -> str:
        """The spec's `family`."""
        return self.spec.family_name

    def tuner(self) -> "Tuner | None":
        """The family's Tuner, or None."""
        return importlib.import_module(self.tuner_module).TUNER if self.tuner_module else None

    @property
    def required_shape_keys(self) -> tuple[str, ...]:
        return tuple(k for k in self.shape_keys if k not in self.optional_shape_keys)

    @property
    def templates(self) -> dict[str, str]:
        """Output file -> template."""
        outputs = {**OUTPUT_TEMPLATES, **self.extra_outputs}
        return {out: f"{self.name}/{name}" for out, name in outputs.items()}

    @property
    def scaffold_template(self) -> str:
        return f"new/{self.name}.toml.jinja"

    @property
    def shape_usage(self) -> str:
        """The --shape keys for help texts: "m,n,k (optional: dtype)"."""
        optional = [k for k in self.shape_keys if k not in self.required_shape_keys]
        return ",".join(self.required_shape_keys) + (
            f" (optional: {','.join(optional)})" if optional else "")


def scaffold(title: str, tiling: Mapping[str, BaseModel],
             tolerances: Mapping[str, Tolerance] = DEFAULT_TOLERANCES, **data: Any) -> dict:
    """The data of a scaffold that writes out the family's tiling and tolerance defaults."""
    return {
        "title": title,
        **data,
        "tiling": {phase: t.model_dump() for phase, t in tiling.items()},
        "tolerance": {dtype: t.model_dump() for dtype, t in tolerances.items()},
    }


class Tuner(ABC):
    """What `opgen tune` needs of a family whose spec has a [[tiling.tuned]] table: the variants
    a tiling may be chosen per (a key: the values of key_fields, as an entry writes them), the
    candidate tilings of each phase, the rules they must pass, the kernel each one launches, and
    how a candidate is timed on the GPU. opgen.tune holds what is common: the candidates' order,
    the compile check, picking winners and writing them into the spec."""

    phases: tuple[str, ...]  # the phases an entry may set, in the order entries list them
    key_fields: tuple[str, ...]  # an entry's key, e.g. ("head_dim", "causal", "max_window")
    # Key fields written only where they differ from these values (attention's max_window: 0,
    # the key of an entry for every window: see entry_key).
    key_defaults: dict[str, Any] = {}
    # The CLI options that pick some keys: option -> (the key field it names, what its values
    # are), e.g. {"--head-dims": ("head_dim", "the spec's head dims")}.
    subset_options: dict[str, tuple[str, str]]

    @abstractmethod
    def keys(self, spec: Any) -> list[tuple]:
        """The keys to tune, in order."""

    def subset_values(self, spec: Any, field: str) -> tuple:
        """The values a subset option may name for a key field: those of the spec's keys."""
        i = self.key_fields.index(field)
        return tuple(dict.fromkeys(key[i] for key in self.keys(spec)))

    def chosen_keys(self, spec: Any, subset: Mapping[str, Iterable[Any]] | None = None
                    ) -> list[tuple]:
        """The keys to tune: those whose fields are all among subset's values for them."""
        subset = subset or {}
        return [key for key in self.keys(spec)
                if all(key[self.key_fields.index(f)] in values for f, values in subset.items())]

    @abstractmethod
    def space(self, spec: Any, key: tuple, phase: str) -> list[dict[str, Any]]:
        """The search space of a phase at key, in the order candidates are listed."""

    @abstractmethod
    def dump(self, phase: str, tiling: dict[str, Any]) -> dict[str, Any]:
        """The tiling as the spec and the package print it (defaults left out), so that a
        candidate equal to the spec's tiling is the same candidate."""

    @abstractmethod
    def problems(self, spec: Any, key: tuple, phase: str, tiling: dict[str, Any]) -> list:
        """The spec's rules' problems with the tiling at key (none: a candidate)."""

    @abstractmethod
    def compile_job(self, spec: Any, plan: Any, key: tuple, phase: str,
                    tiling: dict[str, Any], label: str) -> Any:
        """The CompileJob of the kernel the candidate launches when it is timed."""

    @abstractmethod
    def describe(self, key: tuple) -> str:
        """The key in a label: "d128 causal", "C=4096"."""

    @abstractmethod
    def describe_tiling(self, tiling: dict[str, Any]) -> str:
        """The tiling in a label."""

    @abstractmethod
    def time_candidates(self, spec: Any, plan: Any, autograd: Any, found: list, report: Callable,
                        workers: int, times: dict) -> dict:
        """ms per call of each candidate (None where it failed or was wrong) into times."""

    def current(self, spec: Any, key: tuple, phase: str) -> dict[str, Any]:
        """The tiling the spec launches phase with at key: its entry's, else the base one."""
        tiling = self.entries(spec).get(key, {}).get(phase)
        return tiling if tiling is not None else getattr(spec.tiling, phase).model_dump()

    def untuned(self, spec: Any) -> list[tuple]:
        """The keys to tune that no [[tiling.tuned]] entry serves in any phase: their calls run
        the base tiling. (A key whose entry sets some phases was tuned: `opgen tune` writes only
        the phases whose winner beat the base tiling.)"""
        entries = self.entries(spec)
        return [key for key in self.keys(spec) if key not in entries and all(
            self.current(spec, key, phase) == getattr(spec.tiling, phase).model_dump()
            for phase in self.phases)]

    def entry_key(self, entry: Any) -> tuple:
        """An entry's key: its key_fields' values (the family's plan keys its tables the same)."""
        return tuple(getattr(entry, f) for f in self.key_fields)

    def entries(self, spec: Any) -> dict[tuple, dict[str, dict[str, Any]]]:
        """The spec's [[tiling.tuned]] entries: key -> {phase: tiling}."""
        tables = tuned_tables(spec.tiling.tuned, self.entry_key, self.phases)
        found: dict[tuple, dict[str, dict[str, Any]]] = {}
        for phase, table in tables.items():
            for key, tiling in table.items():
                found.setdefault(key, {})[phase] = tiling
        return found
