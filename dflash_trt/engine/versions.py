"""Release version strings of TensorRT-LLM and friends, compared as releases (pre-releases included)."""

from __future__ import annotations

import re

from dflash_trt.errors import ConfigError

_VERSION = re.compile(r"\s*v?(\d+)\.(\d+)(?:\.(\d+))?(?:\.?(rc|a|b|dev)(\d*))?")
_PRE_RANK = {"dev": 0, "a": 1, "b": 2, "rc": 3}


def version_key(version: str) -> tuple[int, int, int, int, int]:
    """A sortable key of a release or pre-release: 1.3.0rc12 < 1.3.0rc13 < 1.3.0 < 1.3.1."""
    match = _VERSION.match(version)
    if match is None:
        raise ConfigError(f"cannot read a version from {version!r}")
    major, minor, patch, pre, number = match.groups()
    rank = _PRE_RANK[pre] if pre else len(_PRE_RANK)  # a final release sorts after its pre-releases
    return int(major), int(minor), int(patch or 0), rank, int(number or 0)
