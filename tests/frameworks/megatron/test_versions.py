"""Every catalogue entry and parser records the versions it covers; an unknown version is refused, not guessed."""

from __future__ import annotations

import pytest

from attune.errors import RecipeError
from attune.frameworks.megatron import argv as av
from attune.frameworks.megatron import formats
from attune.frameworks.megatron import logs as mlogs
from attune.recipe.catalogue import get_catalogue
from tests.frameworks.megatron.helpers import (
    BRIDGE,
    MLM,
    ROOT,
    argv_of,
    bridge_argv,
    imported,
)


def test_catalogue_and_every_knob_record_versions():
    cat = get_catalogue("megatron")
    assert cat.versions == ">=0.12,<0.21"
    assert all(k.versions for k in cat.knobs.values())
    for fmt in formats.all_formats():
        assert fmt.versions and fmt.package
        assert all(s.versions for s in fmt.spellings.values())
    assert set(mlogs.VERSIONS) == {f.name for f in formats.all_formats()}


@pytest.mark.parametrize("argv, cwd, version, fragment", [
    (argv_of(MLM / "llama3_8b_h100_fp8.sh"), MLM, "0.21.0", "megatron-core 0.21.0 is outside"),
    (bridge_argv("llama3_8b_pretrain_8gpu_h100_bf16.yaml"), BRIDGE, "0.8.0", "megatron-bridge 0.8.0 is outside"),
    (["nemo", "llm", "pretrain", "--factory", "llama3_8b"], ROOT, "3.0.0", "nemo-toolkit 3.0.0 is outside"),
])
def test_a_known_version_outside_the_covered_range_is_refused(argv, cwd, version, fragment):
    with pytest.raises(RecipeError, match=fragment):
        imported(argv, cwd, framework_version=version)


def test_a_bridge_config_of_a_newer_schema_is_reported_as_such(tmp_path):
    text = (BRIDGE / "llama3_8b_pretrain_8gpu_h100_bf16.yaml").read_text() + "spmd:\n  mesh: [8]\n"
    (tmp_path / "new.yaml").write_text(text)
    with pytest.raises(RecipeError, match="sections spmd are not in the ConfigContainer.*newer"):
        imported(bridge_argv("new.yaml"), tmp_path)


def test_version_specifiers():
    assert av.version_in("0.20.0rc2", ">=0.12,<0.21") is True
    assert av.version_in("0.21", ">=0.12,<0.21") is False
    assert av.version_in(None, ">=0.12") is None
    assert av.version_in("0.2.7", "==0.2.*") is True and av.version_in("0.3.0", "==0.2.*") is False
