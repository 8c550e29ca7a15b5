"""The policies package on its own: the registry, and the reference policies' contracts (admissible moves only,
never a repeat, reproducible from the seed and the records, a stop that says why)."""

from __future__ import annotations

import pytest

from attune.bench.suite import load_suite
from attune.engine.policy import Policy, PolicyContext, Stop
from attune.errors import PolicyError
from attune.gate import evaluate
from attune.policies import POLICIES, make_policy
from attune.policies.coordinate import CoordinateDescent
from attune.policies.random import RandomSearch
from attune.recipe.change import Change


@pytest.fixture(scope="module")
def recipe():
    return load_suite("suite", only=["llama3-8b-h100x8"])[0].recipe


def _ctx(recipe, refused: set[str] = frozenset(), records=()) -> PolicyContext:
    """A context at the start, whose pre-check is the real gate's, less the knob names in ``refused``."""

    def admissible(change):
        if set(change) & set(refused):
            return False
        return bool(evaluate(recipe, recipe.with_knobs(**change), (), parent=recipe).admitted)

    return PolicyContext(baseline=recipe, best=recipe, best_measurement=None, records=records,
                         search_space=list(recipe.tuning.search_space), noise_floor=0.02, budget_left_hours=100.0,
                         admissible=admissible)


@pytest.mark.parametrize("name", ["coordinate", "random", "playbook"])
def test_the_registry_builds_each_policy_by_its_name(name: str) -> None:
    policy = make_policy(name, seed=3, lessons=False)
    assert isinstance(policy, Policy) and policy.name == name


def test_an_unknown_policy_names_the_choices() -> None:
    with pytest.raises(PolicyError) as err:
        make_policy("gradient-descent")
    assert "gradient-descent" in str(err.value)
    assert all(p in str(err.value) for p in POLICIES)


def test_llm_policies_need_an_endpoint_before_any_trial(monkeypatch) -> None:
    monkeypatch.delenv("ATTUNE_LLM_BASE_URL", raising=False)
    for name in ("llm", "hybrid"):
        with pytest.raises(PolicyError):
            make_policy(name, lessons=False)


@pytest.mark.parametrize("policy", [CoordinateDescent(), RandomSearch(seed=7)], ids=["coordinate", "random"])
def test_proposals_are_single_knob_admissible_changes(recipe, policy: Policy) -> None:
    change = policy.propose(_ctx(recipe))
    assert isinstance(change, Change) and len(change.set) == 1
    (knob, value), = change.set.items()
    assert knob in recipe.tuning.search_space and value != recipe.knob(knob)
    assert evaluate(recipe, recipe.with_knobs(**change.set), (), parent=recipe).admitted


def test_coordinate_descent_walks_the_search_space_in_order(recipe) -> None:
    space = list(recipe.tuning.search_space)
    first = CoordinateDescent().propose(_ctx(recipe))
    assert isinstance(first, Change)
    (knob, _), = first.set.items()
    # with the first proposal's knob refused, the next one comes from a later knob of the search space
    later = CoordinateDescent().propose(_ctx(recipe, refused={knob}))
    assert isinstance(later, Change)
    (knob2, _), = later.set.items()
    assert space.index(knob2) > space.index(knob)


def test_random_search_is_reproducible_from_its_seed_and_the_records(recipe) -> None:
    draws = [RandomSearch(seed=s).propose(_ctx(recipe)) for s in (1, 1, 2, 3, 4, 5)]
    assert draws[0].set == draws[1].set  # same seed, same records: the same proposal (a resumed run repeats it)
    assert len({repr(sorted(d.set.items())) for d in draws[1:]}) > 1  # other seeds draw otherwise


@pytest.mark.parametrize("policy", [CoordinateDescent(), RandomSearch(seed=0, max_draws=50)],
                         ids=["coordinate", "random"])
def test_nothing_admissible_is_a_stop_with_its_reason(recipe, policy: Policy) -> None:
    stop = policy.propose(_ctx(recipe, refused=set(recipe.tuning.search_space)))
    assert isinstance(stop, Stop) and stop.reason


def test_an_option_a_policy_does_not_take_is_refused_by_name() -> None:
    """Options were swallowed (``**_``): a misspelt threshold tuned with the default and said nothing."""
    with pytest.raises(PolicyError, match=r"policy 'playbook' takes no option 'patiense'; it takes: .*patience"):
        make_policy("playbook", patiense=2)
    with pytest.raises(PolicyError, match=r"policy 'random' takes no option 'base_url'"):
        make_policy("random", base_url="http://127.0.0.1:1")
    # what every policy takes: a seed, and a lessons setting the policies that read none ignore
    for name in ("coordinate", "random", "playbook", "grid"):
        assert make_policy(name, seed=3, lessons=False) is not None
    assert make_policy("playbook", patience=2).patience == 2  # type: ignore[attr-defined]
