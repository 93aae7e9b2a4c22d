"""The family contract: every family declared once (its FAMILY), with what the renderer, the CLI
and `explain` read from it."""

from __future__ import annotations

import importlib
from typing import Literal

import pytest

from opgen.families import FAMILIES, Family, family_names
from opgen.families.contract import OUTPUT_TEMPLATES
from opgen.render import environment
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
    assert set(family.templates) == set(OUTPUT_TEMPLATES)
    env = environment()
    for template in [*family.templates.values(), family.scaffold_template]:
        env.get_template(template)


def test_scaffold_names_are_unique_across_families():
    names = [scaffold for family in FAMILIES.values() for scaffold in family.scaffolds]
    assert len(names) == len(set(names))


def test_explain_help_names_every_family(cli):
    result = cli("explain", "--help")
    for name, family in FAMILIES.items():
        assert f"{name} {family.shape_usage}" in result.stdout
