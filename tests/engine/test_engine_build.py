"""`dflash-trt engine`: dry runs of every preset and runtime, builds of a tiny pair, steps this machine lacks."""

from __future__ import annotations

from pathlib import Path

import pytest

from dflash_trt.cli import main
from dflash_trt.engine.artifacts import drafter_onnx
from dflash_trt.engine.build import BuildRequest, build_engine
from dflash_trt.engine.loader import load_engine
from dflash_trt.engine.manifest import EngineError
from dflash_trt.engine.needs import StepUnavailable, has_cuda
from dflash_trt.engine.presets import RUNTIMES, SHIPPED_CONFIGS, load_preset
from dflash_trt.errors import CompatibilityError, ConfigError

FIXTURES = SHIPPED_CONFIGS
PRESETS = ["gpt-oss-120b", "gpt-oss-20b", "qwen3-8b", "llama-3.1-8b-instruct", "smollm2-135m"]


def has_trtexec() -> bool:
    from dflash_trt.engine.needs import trtexec_path

    return trtexec_path() is not None


def quiet(line: str) -> None:
    pass


@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("name", PRESETS)
def test_dry_run_plans_every_preset_and_runtime_and_writes_nothing(name, runtime, tmp_path, smollm2_drafter_config):
    lines: list[str] = []
    tp = load_preset(name).tp if runtime == "trtllm" else 1  # the local runtimes run on one device
    drafter = smollm2_drafter_config if name == "smollm2-135m" else None
    result = build_engine(BuildRequest(model=name, runtime=runtime, tp=tp, checkpoints_dir=FIXTURES, drafter=drafter,
                                       out=tmp_path / "engine", dry_run=True), log=lines.append)
    text = "\n".join(lines)
    assert not (tmp_path / "engine").exists()
    assert result.manifest is None and result.plan.tp == tp
    for step in range(1, 7):
        assert f"[{step}/6]" in text
    assert "max tokens in flight" in text and "dry run: nothing was written" in text
    assert ("llm_api_options.yaml" in text) == (runtime == "trtllm")


@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("name", PRESETS)
def test_dry_run_with_nothing_downloaded_plans_from_the_published_configs_and_says_what_to_download(
        name, runtime, tmp_path, monkeypatch, capsys):
    """`dflash-trt engine --dry-run` on a machine without any checkpoint: how a user checks a layout
    before a 120 GB download. The whole plan, the artifacts, the missing checkpoints, exit 0."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty-home"))
    preset = load_preset(name)
    tp = preset.tp if runtime == "trtllm" else 1
    out = tmp_path / "engine"
    assert main(["engine", "--model", name, "--tp", str(tp), "--runtime", runtime, "--dry-run",
                 "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert not out.exists()
    for step in range(1, 7):
        assert f"[{step}/6]" in text
    assert "per GPU" in text and "max sequences in flight" in text and f"TP={tp}" in text
    assert f"would write {out / 'manifest.json'}" in text
    assert ("llm_api_options.yaml" in text) == (runtime == "trtllm")
    from_hub = [spec.id for spec in (preset.target, preset.drafter) if not spec.path and spec.gguf is None]
    for checkpoint in from_hub:
        assert "published config.json, shipped in build/presets/configs" in text
        assert f"`hf download {checkpoint} --local-dir " in text
    if from_hub:
        assert f"missing before a build ({len(from_hub)}):" in text
    assert text.endswith("dry run: nothing was written\n")


def test_local_runtimes_refuse_tensor_parallelism():
    with pytest.raises(ConfigError, match="runtime torch runs the target on one device; TP=8 needs --runtime trtllm"):
        build_engine(BuildRequest(model="gpt-oss-120b", runtime="torch", checkpoints_dir=FIXTURES, dry_run=True),
                     log=quiet)


def test_incompatible_pair_is_rejected_before_anything_is_written(tmp_path):
    with pytest.raises(CompatibilityError, match="24-layer target"):
        build_engine(BuildRequest(model="gpt-oss-120b", drafter=FIXTURES / "z-lab/gpt-oss-20b-DFlash",
                                  checkpoints_dir=FIXTURES, out=tmp_path / "engine", dry_run=True), log=quiet)
    assert not (tmp_path / "engine").exists()


def test_mxfp4_is_refused_for_a_target_that_does_not_ship_it():
    with pytest.raises(ConfigError, match="keeps a checkpoint's MXFP4 experts as shipped"):
        build_engine(BuildRequest(model="qwen3-8b", quant="mxfp4", checkpoints_dir=FIXTURES, dry_run=True), log=quiet)


def test_tiny_pair_builds_loads_and_decodes_losslessly(tiny_preset, tiny_pair_dir, tmp_path):
    import torch

    from dflash_trt.decoding.api import generate
    from dflash_trt.decoding.step.sampling import SamplingParams

    out = tmp_path / "engine"
    result = build_engine(BuildRequest(model=str(tiny_preset), target=tiny_pair_dir / "target",
                                       drafter=tiny_pair_dir / "drafter", out=out), log=quiet)
    manifest = result.manifest
    assert (out / "target").is_symlink() and not (out / "drafter").is_symlink()  # HF target linked, drafter copied
    assert set(manifest["files"]) == {"drafter/config.json", "drafter/model.safetensors"}
    assert manifest["external"]["target"]["path"] == str((tiny_pair_dir / "target").resolve())
    assert manifest["runtime"] == "torch" and manifest["block_size"] == 8 and manifest["pending_steps"] == []
    assert manifest["drafter_family"] == "dflash" and manifest["drafter_architecture"] == "DFlashDraftModel"
    assert manifest["tools"]["torch"] == torch.__version__ and manifest["built_at"].endswith("Z")
    engine = load_engine(out)
    prompt = [[3, 17, 42, 5, 99, 7]]
    params = SamplingParams(max_new_tokens=24)
    dflash = generate(engine.target, engine.drafter, prompt, params, block_size=engine.block_size)[0]
    plain = generate(engine.target, None, prompt, params)[0]
    assert dflash.token_ids == plain.token_ids


def test_rebuild_skips_steps_that_are_up_to_date(tiny_preset, tiny_pair_dir, tmp_path):
    request = BuildRequest(model=str(tiny_preset), target=tiny_pair_dir / "target", drafter=tiny_pair_dir / "drafter",
                           out=tmp_path / "engine")
    build_engine(request, log=quiet)
    lines: list[str] = []
    build_engine(request, log=lines.append)
    assert "  target: up to date" in lines and "  drafter: up to date" in lines


def test_onnx_runtime_exports_the_drafter_graph_and_decodes_losslessly(tiny_preset, tiny_pair_hd64, tmp_path):
    from dflash_trt.decoding.api import generate
    from dflash_trt.decoding.step.sampling import SamplingParams

    out = tmp_path / "engine"
    result = build_engine(BuildRequest(model=str(tiny_preset), runtime="onnx", target=tiny_pair_hd64 / "target",
                                       drafter=tiny_pair_hd64 / "drafter", out=out), log=quiet)
    assert result.manifest["artifacts"]["drafter_onnx"] == "drafter.onnx" and "drafter.onnx" in result.manifest["files"]
    engine = load_engine(out)
    assert type(engine.drafter).__name__ == "OnnxDrafter"
    prompt, params = [[3, 17, 42, 5, 99, 7]], SamplingParams(max_new_tokens=16)
    dflash = generate(engine.target, engine.drafter, prompt, params, block_size=engine.block_size)[0]
    assert dflash.token_ids == generate(engine.target, None, prompt, params)[0].token_ids


def test_a_missing_exporter_fails_its_step_and_leaves_an_unloadable_engine(tiny_preset, tiny_pair_dir, tmp_path,
                                                                          monkeypatch):
    def unavailable(*args, **kwargs):
        raise StepUnavailable("drafter-onnx", "the drafter ONNX exporter")

    monkeypatch.setattr(drafter_onnx, "export_onnx", unavailable)
    out = tmp_path / "engine"
    with pytest.raises(StepUnavailable, match="step 'drafter-onnx' needs the drafter ONNX exporter"):
        build_engine(BuildRequest(model=str(tiny_preset), runtime="onnx", target=tiny_pair_dir / "target",
                                  drafter=tiny_pair_dir / "drafter", out=out), log=quiet)
    assert (out / "drafter" / "model.safetensors").is_file() and (out / "manifest.json").is_file()
    with pytest.raises(EngineError, match="incomplete onnx engine, step 'drafter-onnx'"):
        load_engine(out)


@pytest.mark.skipif(has_trtexec(), reason="TensorRT is installed here")
def test_tensorrt_runtime_records_the_build_it_could_not_run(tiny_preset, tiny_pair_hd64, tmp_path):
    out = tmp_path / "engine"
    with pytest.raises(StepUnavailable, match="step 'tensorrt-build' needs TensorRT \\(trtexec\\)"):
        build_engine(BuildRequest(model=str(tiny_preset), runtime="tensorrt", target=tiny_pair_hd64 / "target",
                                  drafter=tiny_pair_hd64 / "drafter", out=out), log=quiet)
    assert (out / "drafter.onnx").is_file()  # everything before the TensorRT build was done
    with pytest.raises(EngineError, match="incomplete tensorrt engine"):
        load_engine(out)


@pytest.mark.skipif(has_cuda(), reason="this machine has a GPU")
def test_nvfp4_without_a_gpu_fails_in_one_line_after_the_rest(tiny_preset, tiny_pair_dir, tmp_path, capsys):
    code = main(["engine", "--model", str(tiny_preset), "--quant", "nvfp4", "--target", str(tiny_pair_dir / "target"),
                 "--drafter", str(tiny_pair_dir / "drafter"), "--out", str(tmp_path / "engine")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "step 'quantize' needs a CUDA GPU" in err[0]
    assert (tmp_path / "engine" / "manifest.json").is_file()


def test_bad_preset_is_a_one_line_cli_error(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ntarget: {id: a/b}\ndrafter: {id: c/d}\nblock_size: 8\nblocksize: 4\n")
    assert main(["engine", "--model", str(bad), "--dry-run"]) == 2
    assert capsys.readouterr().err.strip() == (f"error: {bad}: unknown key 'blocksize' (known keys: name, target, "
                                               "drafter, block_size, description, runtime, tp, ep, dtype, quant, "
                                               "kv_dtype, gpu, memory_fraction, max_batch_size, max_seq_len, "
                                               "moe_backend, profile, draft_attention_backend, kv_block_reuse, "
                                               "cuda_graph_batch_sizes)")


def test_tensorrt_build_runs_trtexec_with_the_plugin_and_a_shape_profile(tiny_preset, tiny_pair_hd64, tmp_path,
                                                                         monkeypatch):
    # A stand-in trtexec (TensorRT cannot be installed here) that records its arguments and writes the plan.
    bin_dir, lib_dir = tmp_path / "bin", tmp_path / "lib"
    bin_dir.mkdir(), lib_dir.mkdir()
    (lib_dir / "libdflash_attention_trt.so").write_bytes(b"")
    args_file = tmp_path / "trtexec-args"
    script = bin_dir / "trtexec"
    script.write_text("#!/bin/sh\nprintf '%s\\n' \"$@\" > " + str(args_file) + "\n"
                      "for a in \"$@\"; do case $a in --saveEngine=*) echo plan > \"${a#--saveEngine=}\";; esac; done\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{__import__('os').environ['PATH']}")
    monkeypatch.setenv("DFLASH_PLUGIN_DIR", str(lib_dir))
    out = tmp_path / "engine"
    result = build_engine(BuildRequest(model=str(tiny_preset), runtime="tensorrt", target=tiny_pair_hd64 / "target",
                                       drafter=tiny_pair_hd64 / "drafter", out=out), log=quiet)
    args = args_file.read_text().splitlines()
    assert f"--onnx={out / 'drafter.onnx'}" in args and "--stronglyTyped" in args
    assert f"--dynamicPlugins={lib_dir / 'libdflash_attention_trt.so'}" in args
    min_shapes = next(a for a in args if a.startswith("--minShapes="))
    max_shapes = next(a for a in args if a.startswith("--maxShapes="))
    assert "block_embeds:1x2x256" in min_shapes and "cache_k_0:1x2x1x64" in min_shapes  # the tail block shrinks
    assert "features:4x512x" in max_shapes and "cache_v_1:4x2x512x64" in max_shapes  # max batch 4, 512 tokens
    assert result.manifest["artifacts"]["tensorrt_plan"] == "drafter.plan" and result.pending == []
    assert load_engine(out, load_models=False).tensorrt_plan == out / "drafter.plan"
