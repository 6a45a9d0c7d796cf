"""The table of drafter families: each family file registers its DrafterBase subclass here.

A family declares its name (`family`, as DrafterConfig.family reads it from the checkpoint's architecture),
its layer class, how it chooses drafts, its checkpoint tensors (`expected_shapes`) and the runtimes that can run
it (`runtimes`). Adding a variant is one new file that calls `register` and one import in drafters/__init__.py.
"""

from __future__ import annotations

FAMILIES: dict[str, type] = {}


def register(cls: type) -> type:
    """Class decorator: make `cls` the drafter of its `family`."""
    if cls.family in FAMILIES:
        raise ValueError(f"drafter family {cls.family!r} is registered twice")  # a programming error
    FAMILIES[cls.family] = cls
    return cls
