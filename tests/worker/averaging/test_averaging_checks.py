"""The partial-round detector, on the failure hivemind reports as success: part of the tensor left
un-averaged because a groupmate died mid-round (hivemind reports such a round as a success)."""

import dataclasses
import math

import pytest
import torch

from p2ptrain.worker.averaging.checks import (
    COMPRESSED_TOLERANCE,
    EXACT_TOLERANCE,
    GRAD,
    SUM_CHUNK,
    Checksums,
    RoundGather,
    check_round,
    checksums,
    fixed_signs,
    params_digest,
    replicas_diverged,
    settled_by_claims,
    step_signs,
)

N = 50_000


def _grads() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    shared = torch.randn(N, generator=generator)
    # two replicas' gradients: correlated, as on real data
    return shared + 0.5 * torch.randn(N, generator=generator), shared + 0.5 * torch.randn(
        N, generator=generator
    )


def _gather(sums: Checksums) -> dict:
    """What a member gathers with a gradient round, as it arrives."""
    return RoundGather(GRAD, sums).to_dict()


def _gathered(a: torch.Tensor, b: torch.Tensor, wa: float, wb: float, step: int = 3) -> dict:
    return {"a": _gather(checksums(a, step, wa)), "b": _gather(checksums(b, step, wb))}


EQUAL = {"a": 1.0, "b": 1.0}  # the plan's weights of the two members


def test_a_complete_weighted_average_passes() -> None:
    a, b = _grads()
    result = (3 * a + 5 * b) / 8
    plan = {"a": 3.0, "b": 5.0}
    assert (
        check_round(result, checksums(a, 3, 3), _gathered(a, b, 3, 5), EXACT_TOLERANCE, plan)
        is None
    )


def test_fp16_compression_noise_passes_the_compressed_tolerance() -> None:
    a, b = _grads()
    result = ((a.half().float() + b.half().float()) / 2).half().float()
    mine = checksums(a, 3, 1)
    assert check_round(result, mine, _gathered(a, b, 1, 1), COMPRESSED_TOLERANCE, EQUAL) is None
    assert check_round(result, mine, _gathered(a, b, 1, 1), EXACT_TOLERANCE, EQUAL) is not None


@pytest.mark.parametrize("missing_fraction", [0.5, 0.3, 0.05])
def test_a_partly_unaveraged_result_is_caught(missing_fraction: float) -> None:
    a, b = _grads()
    result = (a + b) / 2
    cut = int(N * (1 - missing_fraction))
    result[cut:] = a[cut:]  # the dead peer's part stayed local
    problem = check_round(
        result, checksums(a, 3, 1), _gathered(a, b, 1, 1), COMPRESSED_TOLERANCE, EQUAL
    )
    assert problem is not None and "partial" in problem


def test_wrong_weights_and_mixed_steps_are_caught() -> None:
    a, b = _grads()
    unweighted = (a + b) / 2
    plan = {"a": 1.0, "b": 3.0}
    mine = checksums(a, 3, 1)
    assert check_round(unweighted, mine, _gathered(a, b, 1, 3), EXACT_TOLERANCE, plan)
    gathered = {"a": _gather(checksums(a, 3, 1)), "b": _gather(checksums(b, 4, 1))}
    assert "steps" in (check_round(unweighted, mine, gathered, EXACT_TOLERANCE, EQUAL) or "")
    alone = {"a": _gather(checksums(a, 3, 1))}
    assert check_round(a, mine, alone, EXACT_TOLERANCE, EQUAL) == "no groupmates"


def test_replicas_that_started_from_other_parameters_are_noticed() -> None:
    signs = torch.randint(0, 2, (N,), generator=torch.Generator().manual_seed(1)).double() * 2 - 1
    params = torch.randn(N, generator=torch.Generator().manual_seed(2))
    same = params_digest(params, signs)
    noise = torch.Generator().manual_seed(3)  # seeded: an unlucky draw once made it flaky
    # summation-order noise, and one AdamW step apart
    rounded = params_digest(params + 1e-9 * torch.randn(N, generator=noise), signs)
    moved = params_digest(params - 1e-3 * torch.randn(N, generator=noise).sign(), signs)

    def gathered(*digests: tuple[float, float]) -> dict[str, dict]:
        return {
            f"p{i}": _gather(Checksums(1, 1.0, 0.0, 0.0, 1.0, params=d[0], params_norm=d[1]))
            for i, d in enumerate(digests)
        }

    assert not replicas_diverged(gathered(same, same), 1e-6)
    assert not replicas_diverged(gathered(same, rounded), 1e-6)
    assert replicas_diverged(gathered(same, moved), 1e-6)
    assert replicas_diverged(gathered(same, rounded, moved), 1e-4)
    assert not replicas_diverged(gathered(same), 1e-6)  # alone: nothing to compare


def test_a_claimed_parameter_norm_cannot_hide_replicas_that_diverged() -> None:
    """Row 29.10: the digests' spread was scaled by the largest claimed parameter norm, so one
    member claiming 1e300 hid every divergence, and replicas a failed round had set apart were
    never re-synced. The scale is the claims' low median; a claim far from the others is a
    spread itself (a re-sync, as a false digest forces, whose crafted state is refused)."""
    params = torch.randn(N, generator=torch.Generator().manual_seed(2))
    signs = fixed_signs(N)
    same = params_digest(params, signs)
    rounded = params_digest(params * (1 + 1e-9), signs)  # honest norms differ in the last bits
    moved = params_digest(params - 1e-3 * torch.randn(N).sign(), signs)

    def gathered(*claims: tuple[float, float]) -> dict[str, dict]:
        return {
            f"p{i}": _gather(Checksums(1, 1.0, 0.0, 0.0, 1.0, params=c[0], params_norm=c[1]))
            for i, c in enumerate(claims)
        }

    assert replicas_diverged(gathered(same, moved, (same[0], 1e300)), 1e-6)
    assert replicas_diverged(gathered(same, moved, (moved[0], 1e300)), 1e-6)
    assert replicas_diverged(gathered(same, (same[0], 1e300)), 1e-6)
    assert replicas_diverged(gathered(same, same, (same[0], 2 * same[1])), 1e-2)
    assert replicas_diverged(gathered(same, (-1.7e308, 1.7e308), (1.7e308, 0.0)), 1e-2)
    assert not replicas_diverged(gathered(same, rounded, same), 1e-6)
    assert not replicas_diverged(gathered(same, same, (same[0], same[1] * (1 + 1e-3))), 1e-2)


def _grad(sums: object) -> dict:
    return {"kind": "grad", "checksums": sums}


@pytest.mark.parametrize(
    "bad",
    [
        _grad({"step": "3", "weight": 1.0, "total": 0.0, "projection": 0.0, "norm": 1.0}),
        _grad({"step": 3, "weight": "1", "total": 0.0, "projection": 0.0, "norm": 1.0}),
        _grad({"step": 3, "weight": [1] * 1000, "total": 0.0, "projection": 0.0, "norm": 1.0}),
        _grad({"step": 3, "weight": 1.0, "total": math.nan, "projection": 0.0, "norm": 1.0}),
        _grad({"step": 3, "weight": 1e300, "total": 0.0, "projection": 0.0, "norm": 1.0}),
        _grad({"step": 3, "weight": 1.0, "total": 0.0, "projection": 0.0, "norm": 10**400}),
        _grad({"step": 3, "weight": 1, "total": 0, "projection": 0, "norm": 1, "params": "x"}),
        _grad({"step": 3}),
        _grad("not an object"),
        {"step": 3, "weight": 1.0, "total": 0.0, "projection": 0.0, "norm": 1.0},  # no kind
        "not an object",
        None,
    ],
)
def test_a_groupmates_badly_typed_metadata_fails_the_round_without_raising(bad: object) -> None:
    """A groupmate's gathered metadata comes from the network: the round is refused, and
    nothing raises in the checks (which run inside the training step)."""
    a = torch.randn(50)
    gathered = {"me": _gather(checksums(a, 3, 1)), "them": bad}
    plan = {"me": 1.0, "them": 1.0}
    problem = check_round(a, checksums(a, 3, 1), gathered, EXACT_TOLERANCE, plan)
    assert problem is not None and "them" in problem
    assert replicas_diverged(gathered, 1e-6) is False  # one valid digest: nothing to compare


def test_a_weight_the_plan_does_not_give_fails_the_round() -> None:
    """hivemind's reducer used to take each sender's own weight: a groupmate claiming a huge
    one (or a stranger not in the plan) now fails the round, whatever the result."""
    a, b = _grads()
    lying = (a + 1000 * b) / 1001  # what the liar's claimed weight would make of the mean
    problem = check_round(
        lying, checksums(a, 3, 1), _gathered(a, b, 1, 1000), EXACT_TOLERANCE, EQUAL
    )
    assert problem is not None and "plan gives" in problem
    stranger = {"a": 1.0, "c": 1.0}
    problem = check_round(
        (a + b) / 2, checksums(a, 3, 1), _gathered(a, b, 1, 1), EXACT_TOLERANCE, stranger
    )
    assert problem is not None and "not in the plan" in problem


def test_a_claimed_huge_norm_no_longer_widens_the_tolerance() -> None:
    """The old check scaled its tolerance by the largest claimed norm: a liar claiming 1e300
    made any result pass. The scale is now the low median, and such a claim fails the round."""
    a, b = _grads()
    garbage = torch.randn(N) * 100
    liar = _gather(dataclasses.replace(checksums(b, 3, 1), norm=1e300))
    gathered = {"a": _gather(checksums(a, 3, 1)), "b": liar}
    problem = check_round(garbage, checksums(a, 3, 1), gathered, COMPRESSED_TOLERANCE, EQUAL)
    assert problem is not None and "median" in problem
    # a modest lie: the norm check passes, the checksums (scaled by the median) do not
    modest = _gather(dataclasses.replace(checksums(b, 3, 1), norm=2 * float(b.norm())))
    gathered = {"a": _gather(checksums(a, 3, 1)), "b": modest}
    assert check_round(garbage, checksums(a, 3, 1), gathered, COMPRESSED_TOLERANCE, EQUAL)


def test_a_result_longer_than_the_members_gradients_fails_the_round() -> None:
    """Garbage orthogonal to both checksum directions (the ±1 signs are predictable from the
    step) keeps the checksums right; it cannot keep the result's norm within the triangle
    inequality's bound."""
    a, b = _grads()
    honest = (a + b) / 2
    ones = torch.ones(N, dtype=torch.float64)
    signs = (
        torch.randint(
            0,
            2,
            (N,),
            generator=torch.Generator().manual_seed(1_000_003 * 3 + 17),
            dtype=torch.int8,
        ).double()
        * 2
        - 1
    )
    garbage = torch.randn(N, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    basis, _ = torch.linalg.qr(torch.stack([ones, signs], dim=1))
    garbage -= basis @ (basis.T @ garbage)  # both checksum directions projected out
    poisoned = honest + (10 * float(a.norm()) * garbage / garbage.norm()).float()
    mine = checksums(a, 3, 1)
    gathered = _gathered(a, b, 1, 1)
    assert check_round(honest, mine, gathered, COMPRESSED_TOLERANCE, EQUAL) is None
    problem = check_round(poisoned, mine, gathered, COMPRESSED_TOLERANCE, EQUAL)
    assert problem is not None and "result norm" in problem


def test_checksums_and_digest_are_the_float64_formulas_they_name() -> None:
    """checksums() and params_digest() fill their buffers in place (a small CPU quota pays
    for every temporary); their values stay the plain float64 formulas, signs and all."""
    flat = torch.randn(10_001)
    values = flat.double()
    generator = torch.Generator().manual_seed(1_000_003 * 29 + 17)
    step_signs = torch.randint(0, 2, (10_001,), generator=generator, dtype=torch.int8) * 2 - 1
    mine = checksums(flat.reshape(73, 137), 29, 0.5)
    assert mine.step == 29 and mine.weight == 0.5
    assert mine.total == pytest.approx(values.sum().item(), rel=1e-12)
    assert mine.projection == pytest.approx((values * step_signs).sum().item(), rel=1e-9)
    assert mine.norm == pytest.approx(values.norm().item(), rel=1e-12)
    fixed = torch.randint(
        0, 2, (10_001,), generator=torch.Generator().manual_seed(7), dtype=torch.int8
    )
    assert torch.equal(fixed_signs(10_001), fixed.double() * 2 - 1)
    digest, norm = params_digest(flat, fixed_signs(10_001))
    assert digest == pytest.approx((values * (fixed.double() * 2 - 1)).sum().item(), rel=1e-9)
    assert norm == pytest.approx(values.norm().item(), rel=1e-12)


def test_a_round_checked_with_given_signs_is_checked_alike() -> None:
    """An outer round passes its stage's fixed signs to both its claims and its check (one
    sign vector a stage, not two a round): the same verdicts as the step's own signs."""
    a, b = _grads()
    signs = fixed_signs(N)
    assert checksums(a, 3, 1, step_signs(N, 3)) == checksums(a, 3, 1)
    gathered = {"a": _gather(checksums(a, 3, 1, signs)), "b": _gather(checksums(b, 3, 1, signs))}
    mine = checksums(a, 3, 1, signs)
    good = check_round((a + b) / 2, mine, gathered, EXACT_TOLERANCE, EQUAL, signs=signs)
    assert good is None
    partial = torch.cat([((a + b) / 2)[: N // 2], a[N // 2 :]])
    bad = check_round(partial, mine, gathered, EXACT_TOLERANCE, EQUAL, signs=signs)
    assert bad is not None and "checksum" in bad


def test_chunked_checksums_equal_one_float64_pass_across_chunk_edges() -> None:
    """The sums go a chunk at a time (no stage-sized float64 copy); across chunk edges and a
    ragged last chunk they are the float64 sums of the whole vector."""
    n = 3 * SUM_CHUNK + 12_345
    values = torch.randn(n, generator=torch.Generator().manual_seed(4))
    signs = fixed_signs(n)
    assert signs.dtype == torch.int8 and set(signs.unique().tolist()) == {-1, 1}
    exact = values.double()
    sums = checksums(values, 7, 2.0, signs)
    assert math.isclose(sums.total, exact.sum().item(), rel_tol=1e-9, abs_tol=1e-9)
    assert math.isclose(
        sums.projection, (exact @ signs.double()).item(), rel_tol=1e-9, abs_tol=1e-9
    )
    assert math.isclose(sums.norm, exact.norm().item(), rel_tol=1e-12)
    projection, norm = params_digest(values, signs)
    assert (projection, norm) == (sums.projection, sums.norm)
    default = checksums(values, 7, 2.0)  # the step's own signs
    assert math.isclose(
        default.projection, (exact @ step_signs(n, 7).double()).item(), rel_tol=1e-9, abs_tol=1e-9
    )


def test_claims_that_fail_a_whole_group_settle_the_round_and_anything_else_is_retried() -> None:
    """A pair's claimed norms 5x apart fail the round on the claims alone: gathered again from
    the same two members they fail again, so no second attempt is made. A result that is off
    (a partial round), a group missing a member, or members at another step are retried."""
    a, b = _grads()
    uneven = _gathered(a, 5 * b, 1, 1)
    mine = checksums(a, 3, 1)
    problem = check_round((a + 5 * b) / 2, mine, uneven, EXACT_TOLERANCE, EQUAL)
    assert problem is not None and "claimed gradient norm" in problem
    assert settled_by_claims(mine, uneven, EQUAL, GRAD)
    even = _gathered(a, b, 1, 1)
    assert check_round(a, mine, even, EXACT_TOLERANCE, EQUAL) is not None  # half averaged
    assert not settled_by_claims(mine, even, EQUAL, GRAD)
    assert not settled_by_claims(mine, {"a": uneven["a"]}, EQUAL, GRAD)  # b never joined
    ahead = {"a": uneven["a"], "b": _gather(checksums(5 * b, 4, 1))}
    assert not settled_by_claims(mine, ahead, EQUAL, GRAD)
