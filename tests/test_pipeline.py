"""CheckFree+ stage order (paper §4.2) and the CheckFree weights ω (§4.1, docs/paper.md §2)."""

import math

import pytest

from checkfree.pipeline import clip_coefficient, stage_order
from checkfree.recovery.math import checkfree_weight


def test_in_order_without_swaps():
    assert stage_order(1, 6, swaps=False) == [1, 2, 3, 4, 5, 6]


@pytest.mark.parametrize(
    "S, odd",
    [
        (4, [2, 1, 4, 3]),
        (6, [2, 1, 3, 4, 6, 5]),
        (12, [2, 1, 3, 4, 5, 6, 7, 8, 9, 10, 12, 11]),
    ],
)
def test_swaps_on_odd_microbatches(S, odd):
    assert stage_order(0, S, swaps=True) == list(range(1, S + 1))
    assert stage_order(2, S, swaps=True) == list(range(1, S + 1))
    assert stage_order(1, S, swaps=True) == odd
    assert stage_order(3, S, swaps=True) == odd


@pytest.mark.parametrize("S", [1, 2, 3])
def test_swaps_need_four_stages(S):
    with pytest.raises(ValueError, match=f"n_stages ≥ 4 .*got {S}"):
        stage_order(1, S, swaps=True)


def test_checkfree_weight_modes():
    assert checkfree_weight(3.0, 1.0, "paper") == 3.0
    # the release's variant: the norm after clipping to 1.0, plus 1e-4
    assert math.isclose(checkfree_weight(3.0, 1.0, "clipped"), 3.0 * (1.0 / (3.0 + 1e-6)) + 1e-4)
    assert math.isclose(checkfree_weight(0.5, 1.0, "clipped"), 0.5 + 1e-4)
    assert clip_coefficient(0.5, 1.0) == 1.0
    with pytest.raises(ValueError, match="grad_norm_mode"):
        checkfree_weight(1.0, 1.0, "other")
