"""The variants `bench convergence` trains (convergence_bench.py) and their acceptance: how each
syncs (every step, or DiLoCo rounds of H steps: outer compression, fragments, outer step), where a
stage boundary quantizes activations, and the reference variant its final loss is held to, within
LIMITS. Plain data, no torch."""

from __future__ import annotations

from dataclasses import dataclass, replace

from p2ptrain.harness.scaleout_runs import (
    OUTER_FRAGMENTS,
    OUTER_LR,
    OUTER_MOMENTUM,
    TOPK_INNER_STEPS,
)

# acceptance (issue 28): a variant's final loss over its reference's at most this
LIMITS = {"diloco": 1.05, "int8": 1.01, "topk": 1.03, "act_int8": 1.01}


@dataclass(frozen=True)
class Variant:
    name: str
    sync: str = "step"  # "step" or "diloco"
    inner_steps: int = 1
    outer_compression: str = "fp16"
    boundary: str = ""  # "", "fp16" or "int8": a stage boundary in the middle of the model
    outer_lr: float = OUTER_LR
    outer_momentum: float = OUTER_MOMENTUM
    # steps a round runs beside the inner steps before its result is applied, as the product's
    # rounds do (worker/averaging/outer_rounds.py); -1: the product's overlap_steps(H)
    overlap: int = -1
    # Streaming DiLoCo's fragments: slices of the model whose rounds are staggered over H
    fragments: int = 1
    reference: str = "step"  # the variant its acceptance compares against
    limit: float = 0.0  # 0 = no acceptance target


def default_variants(inner_steps: list[int]) -> list[Variant]:
    """step, diloco at each H, diloco at the first H with int8 and top-k, activations fp16/int8."""
    first = inner_steps[0]
    variants = [Variant("step")]
    variants += [Variant(f"diloco_h{h}", "diloco", h, limit=LIMITS["diloco"]) for h in inner_steps]
    reference = f"diloco_h{first}"
    variants += [
        Variant(f"diloco_h{first}_int8", "diloco", first, "int8", reference=reference),
        Variant(f"diloco_h{first}_topk", "diloco", first, "topk", reference=reference),
        Variant(
            f"diloco_h{TOPK_INNER_STEPS}_topk",
            "diloco",
            TOPK_INNER_STEPS,
            "topk",
            reference=reference,
        ),
    ]
    # the acceptance: int8 at the same H; top-k at its own H (fewer bytes a step than int8's)
    limited = {
        f"diloco_h{first}_int8": LIMITS["int8"],
        f"diloco_h{TOPK_INNER_STEPS}_topk": LIMITS["topk"],
    }
    variants = [replace(v, limit=limited.get(v.name, v.limit)) for v in variants]
    variants.append(
        Variant(
            f"diloco_h{first}_int8_f{OUTER_FRAGMENTS}",
            "diloco",
            first,
            "int8",
            fragments=OUTER_FRAGMENTS,
            reference=f"diloco_h{first}_int8",
        )
    )
    variants.append(
        Variant(f"diloco_h{first}_paper", "diloco", first, outer_lr=0.7, outer_momentum=0.9)
    )
    variants += [
        Variant("act_fp16", boundary="fp16"),
        Variant("act_int8", boundary="int8", reference="act_fp16", limit=LIMITS["act_int8"]),
    ]
    return variants
