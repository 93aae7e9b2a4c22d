"""The family contract: every family declared once (its FAMILY), with what the renderer, the CLI
and `explain` read from it."""

from __future__ import annotations

import importlib
import itertools
from pathlib import Path
from typing import Literal

import pytest

from opgen.families import FAMILIES, Family, family_names
from opgen.families.contract import OUTPUT_TEMPLATES
from opgen.render import environment, load_plan
from opgen.spec import SpecBase


@pytest.mark.parametrize("name", family_names())
def test_family_declares_the_contract(name):
    family = FAMILIES[name]
    assert isinstance(family, Family) and family.name == name
    assert importlib.import_module(f"opgen.families.{name}").FAMILY is family
    assert issubclass(family.spec, SpecBase)
    assert family.spec.model_fields["family"].annotation == Literal[name]
    assert family.description and family.scaffolds
    assert all(data["title"] for data in family.scaffolds.values())
    assert set(family.required_shape_keys) <= set(family.shape_keys)
    assert set(family.templates) == set(OUTPUT_TEMPLATES) | set(family.extra_outputs)
    env = environment()
    for template in [*family.templates.values(), family.scaffold_template]:
        env.get_template(template)


@pytest.mark.parametrize("name", [n for n in family_names() if FAMILIES[n].tuner_module])
def test_a_tuner_names_the_fields_and_phases_of_its_spec_s_tuned_entries(name):
    from opgen.families.contract import Tuner

    family = FAMILIES[name]
    tuner = family.tuner()
    assert isinstance(tuner, Tuner) and all(option.startswith("--") for option in tuner.subset_options)
    entry = family.spec.model_fields["tiling"].annotation.model_fields["tuned"].annotation
    (entry,) = entry.__args__[:1]  # tuple[Entry, ...]
    assert set(tuner.key_fields) | set(tuner.phases) == set(entry.model_fields)
    spec = family.spec.model_validate({"name": "x", "family": name})
    keys = tuner.keys(spec)
    assert keys and all(len(k) == len(tuner.key_fields) for k in keys)
    for field, _ in tuner.subset_options.values():
        assert {k[tuner.key_fields.index(field)] for k in keys} == set(tuner.subset_values(spec, field))


def test_scaffold_names_are_unique_across_families():
    names = [scaffold for family in FAMILIES.values() for scaffold in family.scaffolds]
    assert len(names) == len(set(names))


def test_explain_help_names_every_family(cli):
    result = cli("explain", "--help")
    for name, family in FAMILIES.items():
        assert f"{name} {family.shape_usage}" in result.stdout


SHIPPED_SPECS = sorted((Path(__file__).resolve().parent.parent / "specs").glob("*.toml"))
SAVES = ("save", "recompute")  # the generated rowwise and swiglu tests run both


def variants_under_test(p) -> list[tuple[str, ...]]:
    """Each kernel variant the generated tests launch, read from the plan fields their templates
    print, as the words its compile job's label holds (kernel, dtype, the variant's choices)."""
    if p.family in ("rmsnorm", "scaled_silu"):
        aux = "rstd" if p.family == "rmsnorm" else "sigmoid"
        return [v for d, s in itertools.product(p.dtypes, SAVES)
                for v in [("fwd", d, f"{aux}={s}"),
                          *(("bwd", d, f"{aux}={s}", f"dw={r}") for r in p.test_reductions)]]
    if p.family == "swiglu":
        # The pair form also runs a and b as the strided halves of one wider tensor.
        layouts = ("halves",) if p.fused else ("contiguous", "halves")
        return [(k, d, f"sigmoid={s}", layout)
                for k, d, s, layout in itertools.product(("fwd", "bwd"), p.dtypes, SAVES, layouts)]
    if p.family == "matmul":
        return [v for d in p.dtypes
                for v in [*(("fwd", d, f"bias={b}") for b in p.bias_variants), ("bwd_da", d),
                          ("bwd_db", d), *([("bwd_dbias", d)] if p.bias else [])]]
    if p.family == "linear_attention":
        # batch and seq_len are symbolic: a variant is its heads and head dims.
        return [(k, d, f"h{case.heads}", f"dk{case.dim_k}", f"dv{case.dim_v}")
                for k, d, case in itertools.product(("fwd", "bwd"), p.dtypes, p.test_cases)]
    assert p.family == "attention", p.family
    modes = []
    if any(c.kv_heads == c.heads for c in p.test_cases):
        modes.append(("groups=1", "dk=direct", "dv=direct"))
    if p.gqa_case:  # grouped shapes: atomic and each deterministic reduction (the spec's among them)
        modes += [(f"dk={r}", f"dv={r}") for r in ("atomic", *p.deterministic_reductions)]
    variants = [("bwd_dsinks",)] if p.sinks else []
    for layout, d, dim in itertools.product(p.layouts, p.dtypes, p.head_dims):
        tag = (layout, d, f"d{dim}")
        variants += [("bwd_preprocess", *tag), ("bwd_postprocess", *tag)]
        for mask in p.mask_cases:
            variants += [("fwd", *tag, mask.id), *(("bwd", *tag, mask.id, *m) for m in modes)]
    return variants


@pytest.mark.parametrize("spec_path", SHIPPED_SPECS, ids=lambda path: path.stem)
def test_every_tested_variant_has_a_compile_job(spec_path):
    plan, _ = load_plan(spec_path)
    jobs = [set(job.label.split()) for job in plan.compile_jobs if "(bench)" not in job.label]
    variants = variants_under_test(plan)
    assert variants
    missing = [v for v in variants if not any(set(v) <= words for words in jobs)]
    assert not missing, f"tested variants without a compile job: {missing}"
