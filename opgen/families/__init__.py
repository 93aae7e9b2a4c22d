"""Family registry: each family module exports Spec (its pydantic model), plan(spec, source),
TEMPLATES (output file -> template) and DESCRIPTION."""

from __future__ import annotations

from types import ModuleType

from opgen.families import attention, linear_attention, matmul, rmsnorm, scaled_silu

FAMILIES: dict[str, ModuleType] = {"attention": attention, "scaled_silu": scaled_silu,
                                 "rmsnorm": rmsnorm, "matmul": matmul,
                                 "linear_attention": linear_attention}


def family_names() -> list[str]:
    return sorted(FAMILIES)
