"""The seed of the randomly drawn tests: settable, fixed under CI, fresh otherwise."""

from conftest import CI_SEED, chosen_seed


def test_the_option_then_the_environment_then_ci_then_a_fresh_seed():
    assert chosen_seed(7, {"SPECMEMO_TEST_SEED": "9", "CI": "true"}) == 7
    assert chosen_seed(None, {"SPECMEMO_TEST_SEED": "9", "CI": "true"}) == 9
    assert chosen_seed(None, {"CI": "true"}) == CI_SEED
    fresh = {chosen_seed(None, {}) for _ in range(4)}
    assert len(fresh) > 1  # drawn, not fixed: four draws out of 2^30 coincide with probability ~5e-18
