"""Loading and validating spec files: TOML -> frozen Pydantic models, every error at once.

Validation runs in two stages. Each top-level key is validated on its own (types, ranges, unknown
keys), so that a bad section hides nothing in the others. Then the whole-spec rules run: small
functions that yield (field, message) pairs about how sections fit together. A rule that reads a
section that failed the first stage is skipped (its input is unknown); every other rule runs. The
problems are reported in a fixed order: the first stage's in the order of the model's fields
(unknown top-level keys last), then each rule's in the order of the rules.

Shared pieces live here (dtypes, tiling, tolerances, the base model, the rules every family
shares); each family's own sections and rules are in opgen/families/<family>.py.
"""

from __future__ import annotations

import datetime
import functools
import hashlib
import importlib.util
import json
import keyword
import math
import os
import re
import stat
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Callable, ClassVar, Iterable, Iterator, Literal, get_origin

from pydantic import (AfterValidator, BaseModel, ConfigDict, Field, ValidationError, create_model,
                      model_validator)

from opgen.errors import SpecError

Dtype = Literal["float16", "bfloat16"]

# A spec is a few KiB: anything far larger is not one (and must not be read into memory whole).
MAX_SPEC_BYTES = 1 << 20
# The name becomes a directory, files and functions: well below every file system's limit.
MAX_NAME_LENGTH = 64
# Values echoed in messages are cut to about this many characters.
ECHO_LIMIT = 80

# Modules a generated package, its tests or opgen import, refused as names on every machine. The
# tests of generated/<name>/ run with generated/ on sys.path (it is no package), so a package named
# after a module is imported in its place.
RESERVED_MODULES = frozenset({
    "torch", "tilelang", "tvm", "triton", "numpy", "opgen", "generated", "pytest", "conftest",
    "jinja2", "pydantic", "black", "typer", "rich",
})


class StrictModel(BaseModel):
    """Frozen, unknown keys rejected, no silent coercion of strings to numbers, no nan or inf."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False)


def _power_of_two(minimum: int):
    def check(value: int) -> int:
        if value < minimum or value & (value - 1):
            raise ValueError(f"must be a power of two >= {minimum}")
        return value

    return AfterValidator(check)


def check_identifier(value: str) -> str:
    # The name becomes a directory, a module and a function: no paths, no code, no dunders, and
    # nothing that an import of another module would find instead.
    if len(value) > MAX_NAME_LENGTH:
        raise ValueError(f"must be at most {MAX_NAME_LENGTH} characters (it names a directory, "
                         "files and functions)")
    if not value.isidentifier() or not value.isascii():
        raise ValueError("must be a Python identifier (letters, digits, underscores)")
    if keyword.iskeyword(value) or value.startswith("__"):
        raise ValueError("must not be a Python keyword or start with '__'")
    if value != value.lower():
        raise ValueError("must be lower case (it names a module and a function)")
    shadowed = _module_kind(value)
    if shadowed:
        raise ValueError(f"must not shadow the module '{value}' ({shadowed}): the generated "
                         "package would be imported instead of it; choose another name")
    return value


def _module_kind(name: str) -> str | None:
    """Why `name` is taken as a top-level module, or None when it is free."""
    if name in RESERVED_MODULES:
        return "imported by opgen, the generated packages or their tests"
    if name in sys.stdlib_module_names:
        return "standard library"
    try:
        found = importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # in sys.modules without a spec: a module all the same
        found = True
    return "installed" if found else None


# torch.library namespaces that torch and its libraries define or reserve: a package's ops there
# would clash with theirs.
RESERVED_NAMESPACES = frozenset({
    "aten", "prim", "prims", "torch", "c10d", "higher_order", "inductor", "quantized", "mkldnn",
    "onednn", "profiler", "cuda", "test", "debugprims",
})


def check_namespace(value: str) -> str:
    # Custom ops are torch.ops.<namespace>.<name>_<phase>: one attribute name, shared by every
    # package that vendors the same namespace.
    if len(value) > MAX_NAME_LENGTH:
        raise ValueError(f"must be at most {MAX_NAME_LENGTH} characters")
    if not value.isidentifier() or not value.isascii() or value.startswith("_"):
        raise ValueError("must be a Python identifier (letters, digits, underscores) that does "
                         "not start with '_': the custom ops are torch.ops.<namespace>.<op>")
    if value != value.lower():
        raise ValueError("must be lower case")
    if keyword.iskeyword(value):
        raise ValueError("must not be a Python keyword")
    if value in RESERVED_NAMESPACES:
        raise ValueError("must not be a namespace of torch's own ops; choose one of your "
                         "project's, e.g. its package name")
    return value


Identifier = Annotated[str, AfterValidator(check_identifier)]
Namespace = Annotated[str, AfterValidator(check_namespace)]
Block = Annotated[int, _power_of_two(16)]
# A block's rows in a row-wise phase: one row a block is allowed.
RowBlock = Annotated[int, _power_of_two(1)]
Threads = Annotated[int, Field(ge=32, le=1024, multiple_of=32)]
Stages = Annotated[int, Field(ge=0, le=4)]
PositiveInt = Annotated[int, Field(ge=1)]


def shapes_of(model: type[BaseModel], rows: Iterable[tuple]) -> tuple:
    """Shape models from tuples in the order of the model's fields (compact defaults)."""
    return tuple(model(**dict(zip(model.model_fields, row, strict=True))) for row in rows)


# Any tensor shape, e.g. x [..., C].
TensorShape = Annotated[tuple[PositiveInt, ...], Field(min_length=1)]


class MatrixShape(StrictModel):
    """An x of shape [rows, channels]."""

    rows: PositiveInt
    channels: PositiveInt


class Tolerance(StrictModel):
    rtol: Annotated[float, Field(gt=0, le=1)]
    atol: Annotated[float, Field(gt=0, le=1)]


# 16-bit inputs with fp32 accumulation: fp16 1e-2, bf16 2e-2.
DEFAULT_TOLERANCES = {
    "float16": Tolerance(rtol=1e-2, atol=1e-2),
    "bfloat16": Tolerance(rtol=2e-2, atol=2e-2),
}


class TestSection(StrictModel):
    """[test] keys every family shares; a family's [test] adds its `shapes` (TestSection.of)."""

    default_tolerances: ClassVar[dict[str, Tolerance]] = DEFAULT_TOLERANCES
    tolerance: dict[Dtype, Tolerance] = {}

    def tolerance_for(self, dtype: str) -> Tolerance:
        return self.tolerance.get(dtype, self.default_tolerances[dtype])

    @classmethod
    def of(cls, shape: Any, shapes: tuple, tolerances: dict[str, Tolerance] = DEFAULT_TOLERANCES,
           **keys: tuple[Any, Any]) -> type[TestSection]:
        """A family's [test] model: `shapes`, each a `shape` (default `shapes`), the family's
        per-dtype tolerance defaults, and any keys of its own (key=(type, default))."""
        model = create_model("TestSection_of_family", __base__=cls,
                             shapes=(tuple[shape, ...], shapes), **keys)
        model.default_tolerances = tolerances
        return model


# How a gradient is reduced into its buffer: written once per element, fp32 atomic adds into a
# zeroed buffer, fp32 partials summed afterwards, or summed inside one block that walks every
# contribution (attention's grouped dK/dV) and written once.
ReductionKind = Literal["direct", "atomic", "split", "in_block"]


class Reduction(StrictModel):
    """[grads.<grad>] of a gradient whose allowed reductions depend on the variant: each family's
    rules check them, with the reason."""

    reduction: ReductionKind


class DirectGrad(StrictModel):
    # Each element is written once, by the block that owns it.
    reduction: Literal["direct"] = "direct"


class AtomicOrSplitGrad(StrictModel):
    # atomic: in-block fp32 sums, then fp32 atomic adds into a zeroed buffer. split: each block
    # writes its fp32 partials once; they are summed on the host in a fixed order (deterministic,
    # a little more memory).
    reduction: Literal["atomic", "split"] = "atomic"


class SavedSigmoid(StrictModel):
    """[saved] of an op whose backward needs sigmoid of an input: recompute (the forward saves the
    inputs only; the backward computes sigmoid again, a few FLOPs per element) or save (the
    forward also writes it in fp32, 4 more bytes per element held between forward and backward,
    no exp in the backward; in the input's dtype its rounding would show in the gradients)."""

    sigmoid: Literal["recompute", "save"] = "recompute"


class WeightGrads(StrictModel):
    """[grads] of an op of x and one learnable weight w: dx written once, dw reduced."""

    dx: DirectGrad = DirectGrad()
    dw: AtomicOrSplitGrad = AtomicOrSplitGrad()


class BenchSection(StrictModel):
    """[bench] keys every family shares; a family's [bench] adds its `shapes` and `dtype` (their
    defaults differ; BenchSection.of), which the shared rules check."""

    warmup_ms: PositiveInt = 25
    rep_ms: PositiveInt = 100

    @classmethod
    def of(cls, shape: Any, shapes: tuple, dtype: str) -> type[BenchSection]:
        """A family's [bench] model: `shapes`, each a `shape` (default `shapes`), timed in
        `dtype` unless the spec says otherwise."""
        return create_model("BenchSection_of_family", __base__=cls, dtype=(Dtype, dtype),
                            shapes=(tuple[shape, ...], shapes))


# A whole-spec rule: reads the spec, yields (field, message) for each problem it finds.
Rule = Callable[[Any], Iterable[tuple[str, str]]]


def dtypes_listed_once(spec) -> Iterable[tuple[str, str]]:
    if not spec.dtypes:
        yield "dtypes", "must list at least one dtype"
    if len(set(spec.dtypes)) != len(spec.dtypes):
        yield "dtypes", "must not repeat a dtype"


def tested_shapes_listed(spec) -> Iterable[tuple[str, str]]:
    if not spec.test.shapes:
        yield "test.shapes", "must list at least one shape"


def bench_shapes_listed(spec) -> Iterable[tuple[str, str]]:
    if not spec.bench.shapes:
        yield "bench.shapes", "must list at least one shape"


def bench_dtype_built(spec) -> Iterable[tuple[str, str]]:
    # The package refuses the dtypes it was not built for: the benchmark could not run.
    if spec.dtypes and spec.bench.dtype not in spec.dtypes:
        yield "bench.dtype", (
            f"must be one of the built dtypes {', '.join(spec.dtypes)} "
            f"(got {echo(spec.bench.dtype)})"
        )


def untested_tail(shapes: tuple, size: Callable[[Any], int], block: int, whose: str, which: str,
                  example: str, tails: str) -> Iterator[tuple[str, str]]:
    """For a family's rules: the problem of test shapes whose `size` (of a shape) is a multiple
    of `block` in every one of them, so that no partial block, where guard bugs hide, is tested.
    The message reads "add a shape whose <whose> not a multiple of <block> (<which>), e.g.
    <example>: <tails> where guard bugs hide" (whose: "last dim (C) is"; tails: "tail rows are")."""
    if shapes and block > 1 and all(size(s) % block == 0 for s in shapes):
        yield "test.shapes", (f"add a shape whose {whose} not a multiple of {block} ({which}), "
                              f"e.g. {example}: {tails} where guard bugs hide")


SHARED_RULES: tuple[Rule, ...] = (dtypes_listed_once, tested_shapes_listed, bench_shapes_listed,
                                 bench_dtype_built)


class SpecBase(StrictModel):
    """Keys every family shares; family_spec() adds a family's sections (test and bench among
    them) and its rules."""

    family_name: ClassVar[str]
    family_rules: ClassVar[tuple[Rule, ...]] = ()

    name: Identifier
    family: str
    # The torch.library namespace of the package's custom ops (torch.ops.<namespace>.<name>_fwd):
    # a model repo that vendors packages gives them its own, so they never collide with another's.
    namespace: Namespace = "opgen"
    dtypes: tuple[Dtype, ...] = ("float16", "bfloat16")

    @classmethod
    def rules(cls) -> tuple[Rule, ...]:
        """The whole-spec rules, in the order their problems are reported."""
        return SHARED_RULES + cls.family_rules


def family_spec(family: str, rules: tuple[Rule, ...], *, tiling: dict[str, BaseModel],
                test: type[TestSection], bench: type[BenchSection],
                tiling_keys: dict[str, Any] | None = None, **sections: type[BaseModel]
                ) -> type[SpecBase]:
    """A family's spec model: the shared keys, `family = "<family>"`, the family's own sections,
    then [tiling] (a table per phase, defaulting to `tiling`, plus `tiling_keys`: key=(type,
    FieldInfo)), [test] and [bench]; each section defaults to its model's defaults. Its
    whole-spec rules run after the shared ones."""
    sections = {**sections,
                "tiling": tiling_section(f"{family}_tiling", tiling, **(tiling_keys or {})),
                "test": test, "bench": bench}
    model = create_model(f"{family}_spec", __base__=SpecBase, family=(Literal[family], ...),
                         **{key: (section, section()) for key, section in sections.items()})
    model.family_name, model.family_rules = family, rules
    return model


@dataclass(frozen=True)
class SpecSource:
    """Where a spec came from: the path as the user names it (posix, relative), the hash of its
    bytes, its text as it is (a package carries it as spec.toml) and its data."""

    path: str
    sha256: str
    data: dict[str, Any]
    text: str = ""


def spec_digest(spec: BaseModel) -> str:
    """The sha256 of the validated spec (every key, defaults filled in, sorted): what generated
    files are stale against. A comment, whitespace or key-order edit of the file leaves it as it
    is; so does spelling out a default."""
    canonical = json.dumps(spec.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def read_spec(path: Path) -> SpecSource:
    shown = path_for_display(path)
    try:
        raw = _read_spec_bytes(path, shown)
    except OSError as exc:
        raise SpecError(shown, [("", f"cannot read file ({exc.strerror})")]) from None
    try:
        # utf-8-sig: editors that write a byte order mark still give a spec; the hash is of the
        # bytes as they are.
        data = tomllib.loads(raw.decode("utf-8-sig"))
    except UnicodeDecodeError:
        raise SpecError(shown, [("", "not UTF-8 text")]) from None
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(shown, [("", f"invalid TOML: {exc}")]) from None
    except RecursionError:
        raise SpecError(shown, [("", "invalid TOML: arrays or tables nested too deeply")]) from None
    # The text byte for byte (a byte order mark kept) once encoded as UTF-8 again.
    return SpecSource(shown, hashlib.sha256(raw).hexdigest(), data, raw.decode("utf-8"))


TOO_LARGE = f"too large for a spec (over {MAX_SPEC_BYTES >> 20} MiB)"
_FILE_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
               (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
               (stat.S_ISSOCK, "a socket"))


def _read_spec_bytes(path: Path, shown: str) -> bytes:
    # Checked before opening: reading a FIFO blocks until someone writes to it, and a device
    # such as /dev/zero never ends. The non-blocking open and the second check cover a file
    # swapped for one of those in between.
    _require_spec_file(path.stat(), shown)
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    with open(fd, "rb") as file:
        _require_spec_file(os.fstat(file.fileno()), shown)
        raw = file.read(MAX_SPEC_BYTES + 1)
    if len(raw) > MAX_SPEC_BYTES:  # grew since the check
        raise SpecError(shown, [("", TOO_LARGE)])
    return raw


def _require_spec_file(info: os.stat_result, shown: str) -> None:
    if not stat.S_ISREG(info.st_mode):
        kind = next((what for test, what in _FILE_KINDS if test(info.st_mode)), "a special file")
        raise SpecError(shown, [("", f"not a regular file ({kind})")])
    if info.st_size > MAX_SPEC_BYTES:
        raise SpecError(shown, [("", TOO_LARGE)])


def path_for_display(path: Path) -> str:
    """The path relative to the working directory when it lies below it: stable across machines."""
    try:
        return path.resolve().relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return path.as_posix()


def validate(model: type[SpecBase], source: SpecSource) -> Any:
    """The spec as `model`, or SpecError with every problem: each top-level key validated on its
    own, then every whole-spec rule whose sections parsed."""
    data = _lists_to_tuples(source.data)
    values, problems = {}, []
    for key in model.model_fields:
        given = {key: data[key]} if key in data else {}
        try:
            values[key] = getattr(_key_model(model, key).model_validate(given), key)
        except ValidationError as exc:
            problems += _describe_errors(exc.errors(), model)
            values[key] = _Unparsed(key)
    for key in data:
        if key not in model.model_fields:
            problems.append((field_path([key]), _unknown_key(sorted(model.model_fields))))
    spec = model.model_construct(_fields_set=set(data) & set(model.model_fields), **values)
    for rule in model.rules():
        try:
            problems += list(rule(spec))
        except _SectionFailed:
            pass  # the section it reads is already reported
    if problems:
        raise SpecError(source.path, problems)
    return spec


@functools.cache
def _key_model(model: type[BaseModel], key: str) -> type[BaseModel]:
    """A model of `model`'s one field `key` (same type, default and config): validates one
    top-level key of a spec apart from the others."""
    field = model.model_fields[key]
    return create_model(f"{model.__name__}_{key}", __base__=StrictModel,
                        **{key: (field.annotation, field)})


class _SectionFailed(Exception):
    """A rule read a section that failed validation."""


class _Unparsed:
    """Stands in for a top-level key that failed validation: any use of it by a rule raises
    _SectionFailed, and the rule is skipped."""

    def __init__(self, key: str):
        self.key = key

    def _fail(self, *args: Any) -> Any:
        raise _SectionFailed(self.key)

    __getattr__ = __iter__ = __len__ = __bool__ = __contains__ = __getitem__ = _fail
    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __hash__ = __str__ = __format__ = _fail

    def __repr__(self) -> str:
        return f"<{self.key}: failed validation>"


def _lists_to_tuples(value: Any) -> Any:
    # TOML arrays arrive as lists; the frozen strict models hold tuples.
    if isinstance(value, dict):
        return {k: _lists_to_tuples(v) for k, v in value.items()}
    if isinstance(value, list):
        return tuple(_lists_to_tuples(v) for v in value)
    return value


# --- messages: field paths and values as TOML writes them -----------------------------------------

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def field_path(loc: Iterable[str | int]) -> str:
    """A dotted field path: keys that are not bare TOML keys quoted, array indices as numbers."""
    parts = []
    for part in loc:
        text = str(part) if isinstance(part, int) or _BARE_KEY.fullmatch(part) else _toml(part)
        parts.append(_cut(text, f"a key of {len(str(part))} characters"))
    return ".".join(parts)


def echo(value: Any) -> str:
    """A value of the spec as TOML writes it, cut to about ECHO_LIMIT characters."""
    text = _toml(value)
    size = f"a string of {len(value)} characters" if isinstance(value, str) else (
        f"{len(text)} characters")
    return _cut(text, size)


def _cut(text: str, size: str) -> str:
    return text if len(text) <= ECHO_LIMIT else f"{text[:ECHO_LIMIT]}... ({size})"


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)  # TOML's basic strings escape the same way
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{field_path([k])} = {_toml(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (datetime.date, datetime.time)):
        return value.isoformat()
    return repr(value)  # int, float


def _number(value: Any) -> str:
    """A bound of a range, as written in the model (1, not 1.0)."""
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


# What a type error expects, in TOML's words.
_EXPECTED = {
    "dict_type": "a table",
    "model_type": "a table",
    "model_attributes_type": "a table",
    "tuple_type": "an array",
    "list_type": "an array",
    "int_type": "an integer",
    "float_type": "a number",
    "bool_type": "true or false",
    "string_type": "a string",
    "finite_number": "a finite number",
}
_BOUNDS = {
    "greater_than_equal": ("ge", "greater than or equal to"),
    "less_than_equal": ("le", "less than or equal to"),
    "greater_than": ("gt", "greater than"),
    "less_than": ("lt", "less than"),
    "multiple_of": ("multiple_of", "a multiple of"),
}
# Where pydantic reports a dict key that fails its type.
_DICT_KEY = "[key]"


def _describe_errors(errors: list[dict[str, Any]], model: type[BaseModel]) -> list[tuple[str, str]]:
    # A table key of the wrong kind is an unknown key: what lies below it goes unreported, as
    # below any other unknown key.
    bad_keys = [err["loc"][:-1] for err in errors if err["loc"][-1:] == (_DICT_KEY,)]

    def below_bad_key(loc: tuple) -> bool:
        return any(loc[:len(key)] == key and loc != (*key, _DICT_KEY) for key in bad_keys)

    return [_describe(err, model) for err in errors if not below_bad_key(err["loc"])]


def _describe(err: dict[str, Any], model: type[BaseModel]) -> tuple[str, str]:
    loc = list(err["loc"])
    kind = err["type"]
    ctx = err.get("ctx") or {}
    if loc[-1:] == [_DICT_KEY]:
        return field_path(loc[:-1]), _unknown_key(sorted(_choices(ctx)))
    path = field_path(loc)
    if kind == "extra_forbidden":
        return path, _unknown_key(_allowed_keys(model, loc[:-1]))
    if kind == "missing":
        return path, "required key is missing"
    got = f"(got {echo(err['input'])})"
    if kind == "literal_error":
        return path, f"must be one of {', '.join(_choices(ctx))} {got}"
    if kind == "value_error":
        return path, f"{ctx['error']} {got}"
    if kind in _EXPECTED:
        return path, f"must be {_EXPECTED[kind]} {got}"
    if kind in _BOUNDS:
        bound, words = _BOUNDS[kind]
        return path, f"must be {words} {_number(ctx[bound])} {got}"
    if kind == "too_short":
        n = ctx["min_length"]
        return path, f"must have at least {n} item{'' if n == 1 else 's'} {got}"
    return path, f"{err['msg'].replace('Input should', 'must', 1)} {got}"


def _choices(ctx: dict[str, Any]) -> list[str]:
    # pydantic words a Literal's choices as "'a', 'b' or 'c'", and numbers as "2 or 3".
    quoted = re.findall(r"'([^']*)'", ctx["expected"])
    return quoted or re.split(r", | or ", ctx["expected"])


def _unknown_key(allowed: list[str]) -> str:
    return f"unknown key; allowed keys here: {', '.join(allowed)}" if allowed else "unknown key"


def _allowed_keys(model: type[BaseModel], loc: list[str | int]) -> list[str]:
    """Walk the model along loc to list the keys a table accepts (for 'unknown key' hints)."""
    current: Any = model
    in_table = False  # at a dict[...]'s level: the next part is one of its own keys
    for part in loc:
        if isinstance(part, int) or in_table:
            in_table = False
            continue
        fields = getattr(current, "model_fields", None)
        if not fields or part not in fields:
            return []
        annotation = fields[part].annotation
        in_table = get_origin(annotation) is dict
        current = _model_in(annotation)
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


WARPGROUP_THREADS = 128  # WGMMA: a warpgroup is 4 warps


def too_few_elements(elements: int, threads: int) -> str | None:
    """Why a block of `elements` leaves some of its `threads` threads without one, if it does."""
    if elements < threads:
        return (f"must be at least threads ({threads}): one element per thread or more "
                f"(got {elements})")
    return None


def too_many_elements(elements: int, threads: int, per_thread: int, held: str) -> str | None:
    """Why a block of `elements` does not fit its `threads` threads' registers, if it does not:
    each thread holds `held` ("its fp32 terms") for at most `per_thread` elements."""
    if elements > per_thread * threads:
        return (f"must be at most {per_thread} x threads ({per_thread * threads}): each thread "
                f"holds {held} in registers (got {elements})")
    return None


def not_whole_warpgroups(threads: int) -> str | None:
    """Why a WGMMA kernel cannot run with `threads` threads, if it cannot."""
    if threads % WARPGROUP_THREADS:
        return (f"must be a multiple of {WARPGROUP_THREADS} (whole warpgroups for WGMMA) "
                f"(got {threads})")
    return None


class TilingSection(StrictModel):
    """[tiling]: a table per phase, each defaulting to the family's tiling of that phase. A spec
    overrides single keys of a phase; the rest keep the default."""

    @model_validator(mode="before")
    @classmethod
    def _merge_defaults(cls, given: Any) -> Any:
        if not isinstance(given, dict):
            return given
        return {key: {**cls.model_fields[key].default.model_dump(), **value}
                if key in cls.model_fields and isinstance(value, dict)
                and isinstance(cls.model_fields[key].default, BaseModel) else value
                for key, value in given.items()}


def tiling_section(name: str, defaults: dict[str, BaseModel],
                   **keys: tuple[Any, Any]) -> type[TilingSection]:
    """A family's [tiling] model: one table per phase of `defaults`, of that default's model, and
    any keys of the family's own (key=(type, default))."""
    return create_model(name, __base__=TilingSection,
                        **{phase: (type(tiling), tiling) for phase, tiling in defaults.items()},
                        **keys)
