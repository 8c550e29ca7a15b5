"""A component's typed configuration refuses a setting it does not have, by name, rather than passing it on to a
``TypeError`` or dropping it (issue 41, item 2): the run's settings and the backends' options."""

from __future__ import annotations

import pytest

from attune.backends import make_backend
from attune.engine.state import TuneConfig
from attune.errors import AttuneError, BackendError
from attune.testing.factories import tiny_recipe


def test_a_misspelt_run_setting_is_named_with_the_known_ones():
    with pytest.raises(AttuneError, match=r"unknown run setting 'min_gian'; known: .*min_gain"):
        TuneConfig.from_recipe(tiny_recipe(), 1.0, min_gian=0.1)
    assert TuneConfig.from_recipe(tiny_recipe(), 1.0, min_gain=0.1).min_gain == 0.1  # a known one still applies


@pytest.mark.parametrize("name, good", [("sim", {"seed": 3}), ("local", {"extra_env": {"A": "1"}})])
def test_a_backend_option_it_does_not_have_is_named_with_the_ones_it_has(name, good):
    with pytest.raises(BackendError, match=rf"the {name} backend has no option 'sed'; its options: "):
        make_backend(name, sed=1)
    assert make_backend(name, **good) is not None
