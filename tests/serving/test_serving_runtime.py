"""The runtimes the dflash model drives, chosen by the engine manifest: torch and onnx here."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from dflash_trt.errors import DFlashError
from dflash_trt.serving.client import _post_json, generate
from dflash_trt.serving.detokenize import decode
from dflash_trt.serving.generation import Stats, chunks
from dflash_trt.serving.repo import RepoConfig, render_repository
from dflash_trt.serving.requests import GenerationRequest
from dflash_trt.serving.runtime import _drafter, open_runtime
from dflash_trt.serving.server import serve_on_free_ports

PROMPT_IDS = [1, 2, 3, 4, 5]


def tokens(runtime, max_tokens=16):
    return [t for step in runtime.steps(PROMPT_IDS, GenerationRequest("x", max_tokens), ()) for t in step.new_token_ids]


@pytest.mark.slow
def test_the_onnx_engine_generates_the_same_tokens_as_torch(onnx_pair_engines):
    torch_runtime = open_runtime(onnx_pair_engines["torch"], num_threads=1)
    onnx_runtime = open_runtime(onnx_pair_engines["onnx"], num_threads=1)
    assert type(onnx_runtime.drafter).__name__ == "OnnxDrafter"
    assert tokens(onnx_runtime) == tokens(torch_runtime)


def test_an_onnx_engine_verifies_trees_with_plain_tokens(onnx_pair_engines, tmp_path):
    """The manifest lists the tree, the repository takes tree_budget, and the runtime's trees give plain tokens."""
    from dflash_trt.engine.manifest import read_manifest

    assert read_manifest(onnx_pair_engines["onnx"], verify=False)["verification"] == ["chain", "tree"]
    render_repository(RepoConfig(onnx_pair_engines["onnx"], tmp_path / "repo", tree_budget=12))
    plain = open_runtime(onnx_pair_engines["torch"], num_threads=1, block_size=1)
    tree = open_runtime(onnx_pair_engines["onnx"], num_threads=1, tree_budget=12)
    assert type(tree.drafter).__name__ == "OnnxDrafter" and tree.new_scheduler().method.budget == 12
    assert tokens(tree) == tokens(plain)


@pytest.mark.slow
def test_a_served_onnx_engine_answers_like_the_torch_runtime(onnx_pair_engines, tmp_path):
    prompt = "The served onnx drafter"
    reference = open_runtime(onnx_pair_engines["torch"], num_threads=1)
    ids, request, end_ids = reference.tokenizer.encode(prompt), GenerationRequest(prompt, 12), reference.default_end_ids
    (answer,) = chunks(request, ids, reference.steps(ids, request, end_ids), reference.tokenizer, Stats(8), end_ids)
    repo = render_repository(RepoConfig(onnx_pair_engines["onnx"], tmp_path / "repo", num_threads=1))
    with serve_on_free_ports(repo) as server:
        out = generate(server.config.http_url, prompt, 12)
        # NVIDIA's current contract on the same engine (tensorrt_llm, answered by the same dflash model)
        llmapi = _post_json(f"{server.config.http_url}/v2/models/tensorrt_llm/generate",
                            {"text_input": prompt, "sampling_param_max_tokens": 12}, 300)
    assert out["text_output"] == decode(reference.tokenizer, answer.window_ids)  # prompt echoed in both
    assert llmapi["text_output"] == out["text_output"]


def test_a_tensorrt_drafter_is_refused_with_what_it_needs():
    engine = SimpleNamespace(drafter=None, runtime="tensorrt", directory=Path("engines/x"))
    with pytest.raises(DFlashError, match="needs TensorRT on a GPU"):
        _drafter(engine)


def test_an_engine_without_tokenizer_serves_token_ids_and_refuses_text_clearly(tmp_path):
    """A Qwen3 target saved without tokenizer files: no tokenizer is invented for the engine, its
    default end ids come from the model's configs (none here), its vocabulary from the embedding."""
    import yaml

    from dflash_trt.decoding.model.target import has_tokenizer
    from dflash_trt.engine.build import BuildRequest, build_engine
    from dflash_trt.serving.tokenizers import tokenizer_for, vocabulary_size
    from dflash_trt.testing import make_tiny_drafter, make_tiny_target

    target = make_tiny_target("qwen3", tmp_path / "target", vocab_size=16, seed=2)
    make_tiny_drafter(target.config, tmp_path / "drafter", block_size=4)
    preset = tmp_path / "tiny.yaml"
    preset.write_text(yaml.safe_dump({"name": "tiny", "target": {"id": "test/tiny-qwen3"},
                                      "drafter": {"id": "test/tiny-drafter"}, "block_size": 4,
                                      "dtype": "float32", "max_seq_len": 256, "max_batch_size": 1}))
    engine = tmp_path / "engine"
    build_engine(BuildRequest(model=str(preset), target=tmp_path / "target", drafter=tmp_path / "drafter",
                              out=engine), log=lambda _line: None)
    runtime = open_runtime(engine, num_threads=1)
    assert runtime.tokenizer is None and runtime.default_end_ids == () and vocabulary_size(runtime) == 16
    assert not has_tokenizer(engine / "target")
    with pytest.raises(DFlashError, match="the target has no tokenizer"):
        tokenizer_for(engine)


def test_cuda_graphs_are_refused_off_cuda_with_what_they_need(tiny_engine, monkeypatch):
    from dflash_trt.serving.runtime import CUDA_GRAPHS_ENV

    with pytest.raises(DFlashError, match="CUDA graphs .* need a CUDA device, not 'cpu'"):
        open_runtime(tiny_engine, num_threads=1, cuda_graphs=True)
    monkeypatch.setenv(CUDA_GRAPHS_ENV, "1")
    with pytest.raises(DFlashError, match="need a CUDA device"):
        open_runtime(tiny_engine, num_threads=1)
    monkeypatch.setenv(CUDA_GRAPHS_ENV, "0")
    runtime = open_runtime(tiny_engine, num_threads=1)
    assert (type(runtime.target).__name__, type(runtime.drafter).__name__) == ("TargetModel", "DFlashDrafter")


def test_cuda_graphs_wrap_the_target_and_a_pytorch_drafter(tiny_engine):
    """What open_runtime does on a CUDA device with CUDA graphs on (the pair built here on CPU: nothing runs)."""
    from dflash_trt.decoding.model.graphs.drafter import GraphedDrafter
    from dflash_trt.decoding.model.graphs.verifier import GraphedVerifier
    from dflash_trt.decoding.model.target import TargetModel
    from dflash_trt.errors import CompatibilityError
    from dflash_trt.serving.runtime import graphed_pair
    from dflash_trt.testing import make_tiny_drafter, make_tiny_target

    model = make_tiny_target("qwen3", hidden_size=256)  # head_dim 64: the CUDA kernels' size
    target, drafter = graphed_pair(TargetModel(model), make_tiny_drafter(model.config, block_size=4), "cuda:0")
    assert isinstance(target, GraphedVerifier) and isinstance(drafter, GraphedDrafter)
    assert target.use_graphs and drafter.use_graphs
    narrow = open_runtime(tiny_engine, num_threads=1)  # head_dim 16: no kernel covers it, so no graph captures it
    with pytest.raises(CompatibilityError, match="draft steps cannot be captured in CUDA graphs: .* not 16"):
        graphed_pair(narrow.target, narrow.drafter, "cuda")


@pytest.mark.slow
def test_cuda_graphs_leave_the_onnx_drafter_as_it_is(onnx_pair_engines):
    from dflash_trt.serving.runtime import graphed_pair

    runtime = open_runtime(onnx_pair_engines["onnx"], num_threads=1)
    target, drafter = graphed_pair(runtime.target, runtime.drafter, "cuda")
    assert type(target).__name__ == "GraphedVerifier" and drafter is runtime.drafter
