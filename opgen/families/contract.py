"""The family contract: what a family declares once, as its module's FAMILY."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from pydantic import BaseModel

from opgen.plan import PlanBase, SourceInfo, Table
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

    @property
    def name(self) -> str:
        """The spec's `family`."""
        return self.spec.family_name

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
