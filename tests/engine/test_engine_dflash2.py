"""DFlash2 drafters in the engine builder: torch, onnx and tensorrt plan them; trtllm (TensorRT-LLM's DFlash
has no convolution or candidate selector) refuses them in one line that names the torch runtime."""

import json

import pytest

from dflash_trt.engine.build import BuildRequest, build_engine
from dflash_trt.engine.presets import RUNTIMES
from dflash_trt.engine.presets import SHIPPED_CONFIGS as FIXTURES
from dflash_trt.errors import ConfigError


def quiet(line: str) -> None:
    pass


@pytest.fixture
def smollm2_dflash2_config(smollm2_drafter_config):
    path = smollm2_drafter_config / "config.json"
    config = json.loads(path.read_text())
    config["architectures"] = ["DFlash2DraftModel"]
    config["dflash_config"].update(conv_kernel_size=2, conv_group_size=16, selector_rank=32, selector_top_k=16)
    path.write_text(json.dumps(config))
    return smollm2_drafter_config


def test_trtllm_refuses_dflash2_in_one_line(smollm2_dflash2_config, tmp_path):
    with pytest.raises(ConfigError) as info:
        build_engine(BuildRequest(model="smollm2-135m", runtime="trtllm", checkpoints_dir=FIXTURES,
                                  drafter=smollm2_dflash2_config, out=tmp_path / "engine", dry_run=True), log=quiet)
    message = str(info.value)
    assert "DFlash2DraftModel" in message and "--runtime torch" in message and "\n" not in message


@pytest.mark.parametrize("runtime", [r for r in RUNTIMES if r != "trtllm"])
def test_other_runtimes_plan_a_dflash2_drafter(runtime, smollm2_dflash2_config, tmp_path):
    lines = []
    build_engine(BuildRequest(model="smollm2-135m", runtime=runtime, checkpoints_dir=FIXTURES,
                              drafter=smollm2_dflash2_config, out=tmp_path / "engine", dry_run=True), log=lines.append)
    assert any("compatible: DFlash2DraftModel" in line for line in lines)


def test_an_onnx_engine_of_a_dflash2_drafter_drafts_and_samples_like_torch(tiny_preset, tiny_pair_hd64, tmp_path):
    """The loader gives the onnx drafter its host part (the candidate selector) from the engine's drafter copy:
    proposals (drafts, candidates, q) and sampled generations equal the torch runtime's."""
    import torch

    from dflash_trt.decoding.api import generate
    from dflash_trt.decoding.model.target import load_target
    from dflash_trt.decoding.step.sampling import SamplingParams
    from dflash_trt.engine.loader import load_engine
    from dflash_trt.testing import make_tiny_drafter

    drafter_dir = tmp_path / "dflash2"
    drafter = make_tiny_drafter(load_target(tiny_pair_hd64 / "target").config, drafter_dir, block_size=8,
                                family="dflash2", seed=1)
    engines = {}
    for runtime in ("torch", "onnx"):
        engines[runtime] = load_engine(build_engine(BuildRequest(
            model=str(tiny_preset), runtime=runtime, target=tiny_pair_hd64 / "target", drafter=drafter_dir,
            out=tmp_path / runtime), log=quiet).engine_dir)
    onnx, reference = engines["onnx"], engines["torch"]
    assert onnx.manifest["drafter_family"] == "dflash2" and onnx.drafter.samples_drafts
    block = torch.randint(0, 200, (2, 8), generator=torch.Generator().manual_seed(0))
    features = torch.randn(2, 3, drafter.config.num_target_features * 256)
    lens = torch.tensor([3, 2])
    got = onnx.drafter.propose(onnx.target, block, features, lens, onnx.drafter.new_cache(2, 16))
    expected = reference.drafter.propose(reference.target, block, features, lens, reference.drafter.new_cache(2, 16))
    assert torch.equal(got.drafts, expected.drafts) and torch.equal(got.candidates, expected.candidates)
    torch.testing.assert_close(got.q, expected.q, rtol=0, atol=1e-5)
    prompts = [[3, 17, 42, 5, 99, 7]]
    params = [SamplingParams(max_new_tokens=20, temperature=0.8, seed=11)]
    sampled = {name: generate(e.target, e.drafter, prompts, params, block_size=e.block_size)[0]
               for name, e in engines.items()}
    assert sampled["onnx"].token_ids == sampled["torch"].token_ids
    assert sampled["onnx"].acceptance_lengths == sampled["torch"].acceptance_lengths
