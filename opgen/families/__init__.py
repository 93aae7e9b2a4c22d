"""Family registry: each family module declares its FAMILY (opgen.families.contract.Family)."""

from __future__ import annotations

from opgen.families import attention, linear_attention, matmul, rmsnorm, scaled_silu, swiglu
from opgen.families.contract import Family

__all__ = ["FAMILIES", "Family", "family_names"]

FAMILIES: dict[str, Family] = {
    module.FAMILY.name: module.FAMILY
    for module in (attention, linear_attention, matmul, rmsnorm, scaled_silu, swiglu)
}


def family_names() -> list[str]:
    return sorted(FAMILIES)
