"""Which engines run a GGUF target at the GGUF's precision on CPU (manifest target.weights); the build and load
of the demo engine at that precision are tested in test_engine_default_build.py."""

from types import SimpleNamespace

import pytest

from dflash_trt.engine.build import target_weights
from dflash_trt.engine.manifest import EngineError


def test_which_engines_run_the_gguf_precision():
    gguf, directory = SimpleNamespace(target=SimpleNamespace(is_gguf=True)), SimpleNamespace(
        target=SimpleNamespace(is_gguf=False))
    cpu = SimpleNamespace(runtime="torch", dtype="float32", quant="none")
    assert target_weights(gguf, cpu, "auto") == "gguf"
    assert target_weights(gguf, cpu, "float") == "float"
    assert target_weights(directory, cpu, "auto") == "float"
    for other in (dict(runtime="trtllm"), dict(dtype="bfloat16"), dict(quant="fp8")):
        assert target_weights(gguf, SimpleNamespace(**{**vars(cpu), **other}), "auto") == "float", other
    with pytest.raises(EngineError, match="auto or float"):
        target_weights(gguf, cpu, "int4")
