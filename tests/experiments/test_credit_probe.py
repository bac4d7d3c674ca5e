"""The credit probe's checker-free first-error rules on hand-built Monte-Carlo labels."""

import numpy as np

from experiments.probes import credit_probe

# Three responses, four step prefixes each (the last is the response itself, judged wrong):
# row 0: prefixes 0 and 2 completed right once or more, prefix 1 by chance never;
# row 1: no prefix completed right; row 2: prefix 3 past the sampler's prompt room (invalid).
LABELS = np.array([[0.5, 0.0, 0.25, 0.0],
                   [0.0, 0.0, 0.0, 0.0],
                   [1.0, 0.125, 0.0, 0.0]], np.float32)
VALID = np.array([[True, True, True, True],
                  [True, True, True, True],
                  [True, True, True, False]])


def test_first_none_right_is_the_first_prefix_labelled_zero():
    np.testing.assert_array_equal(credit_probe.first_none_right(LABELS, VALID), [1, 0, 2])
    # A row with no valid zero label names no step before its end.
    np.testing.assert_array_equal(
        credit_probe.first_none_right(LABELS[2:], np.array([[True, True, False, False]])), [4])


def test_after_last_right_trusts_any_right_completion():
    # Row 0: prefix 2 was completed right, so steps 0-2 are right and step 3 is the first error,
    # later than the first zero label (prefix 1, a miss of the sampling).
    np.testing.assert_array_equal(credit_probe.after_last_right(LABELS, VALID), [3, 0, 2])


def test_signal_names_are_distinct_and_include_both_unions():
    names = credit_probe.signal_names()
    assert len(names) == len(set(names))
    assert set(credit_probe.VOUCHED.values()) <= set(names)
