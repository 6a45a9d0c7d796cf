"""The default CPU engine (SmolLM2-135M demo pair) end to end, plain and FP8-quantized with ModelOpt."""

from __future__ import annotations

import json

import pytest
import torch

from dflash_trt.decoding.api import generate
from dflash_trt.decoding.step.sampling import SamplingParams
from dflash_trt.engine.build import BuildRequest, build_engine
from dflash_trt.engine.loader import load_engine
from dflash_trt.engine.manifest import EngineError
from dflash_trt.engine.presets import REPO_ROOT, SHIPPED_CONFIGS, load_preset

PROMPTS = ["What is the capital of France?", "Write a haiku about the sea."]


@pytest.fixture(scope="module")
def demo_drafter(tmp_path_factory, smollm2_config):
    """The shipped demo drafter when the repository has it, else a random one of the same format."""
    shipped = REPO_ROOT / load_preset("smollm2-135m").drafter.path
    if (shipped / "config.json").is_file():
        return None  # the preset resolves it
    from dflash_trt.decoding.model.config import DrafterConfig
    from dflash_trt.decoding.model.drafters import DFlashDrafter, save_drafter

    config = DrafterConfig.from_dict({
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": 576, "intermediate_size": 1536,
        "num_hidden_layers": 2, "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64,
        "vocab_size": smollm2_config["vocab_size"], "block_size": 8,
        "num_target_layers": smollm2_config["num_hidden_layers"], "rope_theta": smollm2_config["rope_theta"],
        "max_position_embeddings": 8192, "dflash_config": {"target_layer_ids": [1, 14, 28], "mask_token_id": 0}})
    torch.manual_seed(0)
    directory = tmp_path_factory.mktemp("demo-drafter")
    save_drafter(DFlashDrafter(config), directory)
    return directory


@pytest.fixture(scope="module")
def default_build(tmp_path_factory, demo_drafter):
    """(the default engine's directory, the build's log lines), built once for the module as `make demo` builds it on
    first use (ensure_engine) where the repository has its demo drafter, else by build_engine with a random drafter of
    that format. On a fresh clone the build goes where the repository keeps it (engines/smollm2-135m, which the served
    demo test then uses as it is); where that engine is built already, under a fresh repository root, so that the
    first use is still a real build. The tests below leave this directory as they found it."""
    from dflash_trt.engine import build

    lines: list[str] = []
    if demo_drafter is not None:
        out = tmp_path_factory.mktemp("repository") / "engines" / "smollm2-135m"
        build_engine(BuildRequest(drafter=demo_drafter, out=out), log=lines.append)
        return out, lines
    own = REPO_ROOT / "engines" / "smollm2-135m"
    if not (own / "manifest.json").is_file():
        assert build.ensure_engine(own, log=lines.append) == own
        return own, lines
    root = tmp_path_factory.mktemp("repository")
    out = root / "engines" / "smollm2-135m"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(build, "REPO_ROOT", root)
        assert build.ensure_engine(out, log=lines.append) == out
    return out, lines


@pytest.fixture(scope="module")
def engine_dir(default_build):
    return default_build[0]


@pytest.fixture(scope="module")
def smollm2_config():
    path = SHIPPED_CONFIGS / "HuggingFaceTB/SmolLM2-135M-Instruct/config.json"
    return json.loads(path.read_text())


def chat_ids(tokenizer, prompt):
    return tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                         tokenize=True, return_dict=False)


def decode_both(engine, max_new_tokens=32):
    params = SamplingParams(max_new_tokens=max_new_tokens)
    prompts = [chat_ids(engine.target.tokenizer, p) for p in PROMPTS]
    dflash = generate(engine.target, engine.drafter, prompts, params, block_size=engine.block_size)
    plain = generate(engine.target, None, prompts, params)
    return [r.token_ids for r in dflash], [r.token_ids for r in plain]


@pytest.mark.slow
def test_default_engine_builds_from_the_gguf_and_decodes_losslessly(engine_dir):
    manifest = json.loads((engine_dir / "manifest.json").read_text())
    assert manifest["name"] == "smollm2-135m" and manifest["runtime"] == "torch"
    assert "quantization" not in manifest["artifacts"]
    assert {"target/model.safetensors", "target/tokenizer.json", "target/config.json"} <= set(manifest["files"])
    engine = load_engine(engine_dir)
    assert engine.target.tokenizer is not None and engine.target.num_layers == 30
    # A GGUF target runs at the GGUF's precision (docs/quantized-cpu.md): every linear layer and the head as
    # blocks, with the batch-invariant attention.
    assert manifest["target"]["weights"] == "gguf"
    assert _quantized_layers(engine) == 1 + 7 * 30 and engine.target.attention_override is not None
    # Loaded from target/ with the GGUF's blocks: the same model and tokenizer as the GGUF loaded by itself.
    from dflash_trt.decoding.model.target import load_target

    direct = load_target(manifest["target"]["source"], weights="gguf")
    assert direct.tokenizer.chat_template == engine.target.tokenizer.chat_template
    ids = torch.tensor([chat_ids(direct.tokenizer, PROMPTS[1])])
    assert ids.tolist() == [chat_ids(engine.target.tokenizer, PROMPTS[1])]
    with torch.no_grad():
        assert torch.equal(engine.target.model(ids).logits, direct.model(ids).logits)
    dflash, plain = decode_both(engine)
    assert dflash == plain


@pytest.mark.slow
def test_the_default_engine_is_built_on_first_use_as_make_demo_does(default_build, demo_drafter, monkeypatch):
    """`make bench` on a fresh clone: ENGINE is the default engines/smollm2-135m, which is not built yet (the module's
    build, default_build, is that first use)."""
    from dflash_trt.engine import build

    if demo_drafter is not None:
        pytest.skip("the repository's demo drafter is missing")
    default, lines = default_build
    assert "building the default engine first" in lines[0]
    assert json.loads((default / "manifest.json").read_text())["runtime"] == "torch"  # (loaded by the test above)
    monkeypatch.setattr(build, "REPO_ROOT", default.parents[1])
    later: list[str] = []
    assert build.ensure_engine(default, log=later.append) == default and later == []  # built once


@pytest.mark.slow
def test_an_engine_recorded_as_float_loads_the_dequantized_target(engine_dir, tmp_path):
    """What --target-weights float writes: the target/ directory with plain linear layers; and a GGUF that
    moved away is named in one line."""
    view = tmp_path / "engine"  # the built engine's files, with a manifest of its own to edit
    view.mkdir()
    for item in ("target", "drafter"):
        (view / item).symlink_to(engine_dir / item, target_is_directory=True)
    manifest = json.loads((engine_dir / "manifest.json").read_text())
    manifest["target"]["weights"] = "float"
    (view / "manifest.json").write_text(json.dumps(manifest))
    assert _quantized_layers(load_engine(view, verify=False)) == 0
    manifest["target"].update(weights="gguf", source=str(view / "gone.gguf"))
    (view / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(EngineError, match="gone.gguf is gone; rebuild the engine"):
        load_engine(view, verify=False)


def _quantized_layers(engine) -> int:
    from dflash_trt.decoding.kernels.block_quant import BlockQuantLinear

    return sum(isinstance(m, BlockQuantLinear) for m in engine.target.model.modules())


@pytest.mark.slow
def test_fp8_engine_is_lossless_against_its_own_quantized_target(engine_dir, demo_drafter, tmp_path):
    out = tmp_path / "smollm2-135m-fp8"
    _reuse_converted_target(engine_dir, out)
    result = build_engine(BuildRequest(quant="fp8", drafter=demo_drafter, out=out), log=lambda line: None)
    assert result.manifest["artifacts"]["quantization"] == "quantization/modelopt_state.pth"
    engine = load_engine(out)
    ids = torch.tensor([chat_ids(engine.target.tokenizer, PROMPTS[0])])
    with torch.no_grad():
        quantized = engine.target.model(ids).logits
    from dflash_trt.decoding.model.target import load_target

    with torch.no_grad():
        plain_logits = load_target(engine.target_path).model(ids).logits
    assert not torch.allclose(quantized, plain_logits)  # the FP8 quantizers are really in the loaded model
    # 12 tokens a prompt: ModelOpt's simulated FP8 takes ~0.5 s a token on a 2-core CPU.
    dflash, plain = decode_both(engine, max_new_tokens=12)
    assert dflash == plain  # DFlash output == the quantized target's own greedy output


def test_a_missing_engine_that_is_not_the_default_names_the_command_that_builds_it(tmp_path, capsys):
    from dflash_trt.cli import main

    missing = tmp_path / "engines" / "qwen3-8b"
    assert main(["bench-report", "--engine", str(missing), "--no-serving"]) == 2
    err = capsys.readouterr().err
    assert f"build it with `dflash-trt engine --model qwen3-8b --out {missing}`" in err


def _reuse_converted_target(engine_dir, out):
    """Start `out` with the default build's converted target and that step's record, so that a build into it skips
    converting the GGUF again (steps are idempotent) and the default engine itself stays as it is."""
    import shutil

    shutil.copytree(engine_dir / "target", out / "target")
    (out / ".steps").mkdir()
    shutil.copy(engine_dir / ".steps" / "target.json", out / ".steps" / "target.json")
