"""The plugin tests share one build of the CPU library (CMake, incremental)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def cpu_library():
    from dflash_trt.decoding.kernels.plugin.library import load_library

    return load_library()
