"""The measuring worker's early stop (``verify/worker.py``): which first repetitions of a
timing say the candidate is clearly slower than torch (every paired repetition below
``STOP_BELOW`` of torch's speed). The GPU side, through the real timing, is
``tests/verify/test_timing_gpu.py``."""

from __future__ import annotations

import pytest

from cudal2.verify.worker import STOP_AFTER, STOP_BELOW, clearly_slower

# (candidate µs, torch µs per repetition, stop?)
CASES = [
    pytest.param([30, 31, 29, 30, 32], [20, 20, 20, 20, 20], True, id="every-one-slow"),
    pytest.param([30, 31, 29, 30, 24], [20, 20, 20, 20, 20], False, id="one-at-0.83"),
    pytest.param([25, 25, 25, 25, 25], [20, 20, 20, 20, 20], False, id="exactly-at-the-bound"),
    pytest.param([20, 20, 20, 20, 20], [20, 20, 20, 20, 20], False, id="as-fast"),
    pytest.param([10, 10, 10, 10, 10], [20, 20, 20, 20, 20], False, id="faster"),
    pytest.param([60, 60, 60, 60, 12], [20, 20, 20, 20, 20], False, id="a-fast-one-last"),
    pytest.param([40, 40, 40], [20, 20, 20], True, id="fewer-repetitions"),
    pytest.param([], [], False, id="no-repetition"),
]


@pytest.mark.parametrize("cand, torch_us, stop", CASES)
def test_clearly_slower(cand, torch_us, stop):
    assert clearly_slower({"candidate": cand, "torch": torch_us}) is stop


def test_the_rule_leaves_room_for_a_selectable_kernel():
    # a kernel is selected only where it beats every vendor: the bound is well below 1,
    # and the first repetitions are enough to be paired (paired_spread takes 5)
    assert 0 < STOP_BELOW < 0.9 and STOP_AFTER >= 5


def test_unpaired_samples_are_refused():
    with pytest.raises(ValueError):
        clearly_slower({"candidate": [30, 30], "torch": [20]})
