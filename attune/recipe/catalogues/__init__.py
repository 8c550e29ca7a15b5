"""Built-in knob catalogues, one module per framework. Importing this package registers them."""

from __future__ import annotations

from attune.recipe.catalogues import torch as _torch  # noqa: F401

try:  # the Megatron catalogue arrives with the simulator
    from attune.recipe.catalogues import megatron as _megatron  # noqa: F401
except ImportError:  # pragma: no cover
    pass
