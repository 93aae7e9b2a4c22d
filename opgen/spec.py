"""Loading and validating spec files: TOML -> frozen Pydantic models, every error at once.

Shared pieces live here (dtypes, tiling, tolerances, the base model); each family's own section
is in opgen/families/<family>.py.
"""

from __future__ import annotations

import hashlib
import keyword
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, ClassVar, Iterator, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator

from opgen.errors import SpecError

Dtype = Literal["float16", "bfloat16"]


class StrictModel(BaseModel):
    """Frozen, unknown keys rejected, no silent coercion of strings to numbers."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)


def _power_of_two(minimum: int):
    def check(value: int) -> int:
        if value < minimum or value & (value - 1):
            raise ValueError(f"must be a power of two >= {minimum}")
        return value

    return AfterValidator(check)


def check_identifier(value: str) -> str:
    # The name becomes a directory, a module and a function: no paths, no code, no dunders.
    if not value.isidentifier() or not value.isascii():
        raise ValueError("must be a Python identifier (letters, digits, underscores)")
    if keyword.iskeyword(value) or value.startswith("__"):
        raise ValueError("must not be a Python keyword or start with '__'")
    if value != value.lower():
        raise ValueError("must be lower case (it names a module and a function)")
    return value


Identifier = Annotated[str, AfterValidator(check_identifier)]
Block = Annotated[int, _power_of_two(16)]
Threads = Annotated[int, Field(ge=32, le=1024, multiple_of=32)]
Stages = Annotated[int, Field(ge=0, le=4)]
PositiveInt = Annotated[int, Field(ge=1)]


class Tolerance(StrictModel):
    rtol: Annotated[float, Field(gt=0, le=1)]
    atol: Annotated[float, Field(gt=0, le=1)]


# Seed 000: fp16 1e-2, bf16 2e-2.
DEFAULT_TOLERANCES = {
    "float16": Tolerance(rtol=1e-2, atol=1e-2),
    "bfloat16": Tolerance(rtol=2e-2, atol=2e-2),
}


class TestSection(StrictModel):
    """[test] keys every family shares; families add their `shapes`."""

    default_tolerances: ClassVar[dict[str, Tolerance]] = DEFAULT_TOLERANCES
    tolerance: dict[Dtype, Tolerance] = {}

    def tolerance_for(self, dtype: str) -> Tolerance:
        return self.tolerance.get(dtype, self.default_tolerances[dtype])


class BenchSection(StrictModel):
    """[bench] keys every family shares; families add their `shapes` (and dtype)."""

    warmup_ms: PositiveInt = 25
    rep_ms: PositiveInt = 100


class SpecBase(StrictModel):
    """Keys every family shares."""

    name: Identifier
    family: str
    dtypes: tuple[Dtype, ...] = ("float16", "bfloat16")

    def problems(self) -> Iterator[tuple[str, str]]:
        """Whole-spec checks as (field, message) pairs; families extend this."""
        if not self.dtypes:
            yield "dtypes", "must list at least one dtype"
        if len(set(self.dtypes)) != len(self.dtypes):
            yield "dtypes", "must not repeat a dtype"

    @model_validator(mode="after")
    def _consistent(self):
        problems = list(self.problems())
        if problems:
            # One ValueError carries every problem; validate() splits them back out.
            raise ValueError("\n".join(f"{field}: {msg}" for field, msg in problems))
        return self


@dataclass(frozen=True)
class SpecSource:
    """Where a spec came from: the path as the user names it (posix, relative) and its hash."""

    path: str
    sha256: str
    data: dict[str, Any]


def read_spec(path: Path) -> SpecSource:
    shown = path_for_display(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise SpecError(shown, [("", f"cannot read file ({exc.strerror})")]) from None
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise SpecError(shown, [("", "not UTF-8 text")]) from None
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(shown, [("", f"invalid TOML: {exc}")]) from None
    return SpecSource(shown, hashlib.sha256(raw).hexdigest(), data)


def path_for_display(path: Path) -> str:
    """The path relative to the working directory when it lies below it: stable across machines."""
    try:
        return path.resolve().relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return path.as_posix()


def validate(model: type[StrictModel], source: SpecSource) -> Any:
    try:
        return model.model_validate(_lists_to_tuples(source.data))
    except ValidationError as exc:
        problems = [p for err in exc.errors() for p in _describe(err, model)]
        raise SpecError(source.path, problems) from None


def _lists_to_tuples(value: Any) -> Any:
    # TOML arrays arrive as lists; the frozen strict models hold tuples.
    if isinstance(value, dict):
        return {k: _lists_to_tuples(v) for k, v in value.items()}
    if isinstance(value, list):
        return tuple(_lists_to_tuples(v) for v in value)
    return value


def _describe(err: dict[str, Any], model: type[BaseModel]) -> list[tuple[str, str]]:
    if err["type"] == "value_error" and not err["loc"]:
        # Whole-spec checks (a model validator on the top-level model) report one problem a
        # line, each naming its field first.
        return [tuple(line.split(": ", 1)) for line in str(err["ctx"]["error"]).splitlines()]
    return [_describe_field(err, model)]


def _describe_field(err: dict[str, Any], model: type[BaseModel]) -> tuple[str, str]:
    loc = [str(p) for p in err["loc"]]
    kind = err["type"]
    got = err.get("input")
    if kind == "extra_forbidden":
        allowed = _allowed_keys(model, loc[:-1])
        hint = f"; allowed keys here: {', '.join(allowed)}" if allowed else ""
        return ".".join(loc), f"unknown key{hint}"
    if kind == "missing":
        return ".".join(loc), "required key is missing"
    if kind == "literal_error":
        choices = err["ctx"]["expected"].replace("'", "")
        choices = choices.replace(" or ", ", ")
        return ".".join(loc), f"must be one of {choices} (got {got!r})"
    if kind == "value_error":
        return ".".join(loc), f"{err['ctx']['error']} (got {got!r})"
    msg = err["msg"]
    if kind.endswith("_type") or kind in {"greater_than_equal", "less_than_equal", "greater_than",
                                          "less_than", "multiple_of"}:
        msg = msg[0].lower() + msg[1:]
        return ".".join(loc), f"{msg} (got {got!r})"
    return ".".join(loc), msg


def _allowed_keys(model: type[BaseModel], loc: list[str]) -> list[str]:
    """Walk the model along loc to list the keys a table accepts (for 'unknown key' hints)."""
    current: Any = model
    for part in loc:
        if part.isdigit():
            continue
        fields = getattr(current, "model_fields", None)
        if not fields or part not in fields:
            return []
        current = _model_in(fields[part].annotation)
        if current is None:
            return []
    fields = getattr(current, "model_fields", None)
    return sorted(fields) if fields else []


def _model_in(annotation: Any) -> Any:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


class GemmTiling(StrictModel):
    """Tiles of a GEMM-shaped phase: block_m x block_n tiles, threads, software-pipelining depth."""

    block_m: Block
    block_n: Block
    threads: Threads
    num_stages: Stages


class RowTiling(StrictModel):
    """Tiles of a row-wise phase (a reduction or a cast over block_m rows)."""

    block_m: Block
    threads: Threads


def merge_defaults(given: Any, defaults: dict[str, BaseModel]) -> Any:
    """Let a spec override single keys of a phase's tiling; the rest keep the family defaults."""
    if not isinstance(given, dict):
        return given
    merged: dict[str, Any] = {k: v.model_dump() for k, v in defaults.items()}
    for key, value in given.items():
        if key in merged and isinstance(value, dict):
            merged[key] = {**merged[key], **value}
        else:
            merged[key] = value
    return merged
