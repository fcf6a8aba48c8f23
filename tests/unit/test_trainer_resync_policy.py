import pytest

from dlc_jax.trainer.config import ResyncSection
from dlc_jax.trainer.resync import make_policy


def test_policies():
    ess = make_policy(ResyncSection(policy="ess", threshold=0.5))
    assert ess.should_resync({"ess_lag": 0.49}, 1) and not ess.should_resync({"ess_lag": 0.5}, 9)
    with pytest.raises(KeyError, match="ess_lag"):
        ess.should_resync({}, 1)
    k = make_policy(ResyncSection(policy="every_k", k=3))
    assert [k.should_resync({}, s) for s in (1, 2, 3, 4)] == [False, False, True, True]
    never = make_policy(ResyncSection(policy="never"))
    assert not never.should_resync({"ess_lag": 0.0}, 100)
    on = make_policy(ResyncSection(policy="onpolicy"))
    assert on.should_resync({}, 0) and not on.allows_prefetch and ess.allows_prefetch
