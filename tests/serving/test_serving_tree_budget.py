"""The dflash model's `tree_budget` parameter: rendered into the repository, honoured by the local runtimes (tree
verification, plain decoding's tokens), refused in one line where a tree cannot run (trtllm, a target without
explicit masks); the static (CUDA-graph) verify runs trees."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from dflash_trt.decoding.step.verify import ChainVerify, TreeVerify
from dflash_trt.errors import DFlashError
from dflash_trt.serving.client import generate
from dflash_trt.serving.repo import RepoConfig, render_repository
from dflash_trt.serving.requests import GenerationRequest
from dflash_trt.serving.runtime import open_runtime
from dflash_trt.serving.server import serve_on_free_ports

PROMPT_IDS = [1, 2, 3, 4, 5]


def tokens(runtime, max_tokens=16):
    return [t for step in runtime.steps(PROMPT_IDS, GenerationRequest("x", max_tokens), ()) for t in step.new_token_ids]


def dflash_parameters(repo) -> dict[str, str]:
    text = (repo / "dflash" / "config.pbtxt").read_text()
    return {line.split('key: "')[1].split('"')[0]: line.split('string_value: "')[1].split('"')[0]
            for line in text.splitlines() if line.startswith("parameters {")}


def test_the_repository_carries_the_tree_budget(tiny_engine, tmp_path):
    assert dflash_parameters(render_repository(RepoConfig(tiny_engine, tmp_path / "chain")))["tree_budget"] == "0"
    repo = render_repository(RepoConfig(tiny_engine, tmp_path / "tree", tree_budget=24))
    assert dflash_parameters(repo)["tree_budget"] == "24"
    with pytest.raises(DFlashError, match=r"tree budget must be >= 0 \(0 means the chain\), got -1"):
        render_repository(RepoConfig(tiny_engine, tmp_path / "bad", tree_budget=-1))


def test_a_tree_runtime_verifies_trees_and_gives_plain_tokens(tiny_engine):
    plain = open_runtime(tiny_engine, num_threads=1, block_size=1)
    chain = open_runtime(tiny_engine, num_threads=1)
    tree = open_runtime(tiny_engine, num_threads=1, tree_budget=12)
    assert isinstance(chain.new_scheduler().method, ChainVerify)
    method = tree.new_scheduler().method
    assert isinstance(method, TreeVerify) and method.budget == 12
    assert tokens(tree) == tokens(chain) == tokens(plain)


def test_trtllm_and_targets_without_masks_refuse_a_tree_in_one_line(tiny_engine, monkeypatch, tmp_path):
    import dflash_trt.engine
    from dflash_trt.decoding.model.graphs.verifier import GraphedVerifier

    runtime = open_runtime(tiny_engine, num_threads=1)
    TreeVerify(8).check(GraphedVerifier(runtime.target, graphs=False), runtime.drafter)  # the static verify: trees
    monkeypatch.setattr(runtime.target, "takes_explicit_masks", False, raising=False)
    monkeypatch.setattr(dflash_trt.engine, "load_engine", lambda *args, **kwargs: SimpleNamespace(
        runtime="torch", block_size=8, drafter=runtime.drafter, target=runtime.target, directory=tiny_engine))
    with pytest.raises(DFlashError, match="needs explicit attention masks, which this TargetModel does not run"):
        open_runtime(tiny_engine, num_threads=1, tree_budget=8)
    monkeypatch.setattr(dflash_trt.engine, "load_engine", lambda *args, **kwargs: SimpleNamespace(
        runtime="trtllm", block_size=8))
    with pytest.raises(DFlashError, match="trtllm runtime cannot verify a tree"):
        open_runtime(tiny_engine, tree_budget=8)


@pytest.mark.slow
def test_a_served_tree_answers_like_plain_decoding(tiny_engine, tmp_path):
    """The real tritonserver with tree_budget: greedy answers equal the plain-decoding repository's."""
    prompt, answers = "The tree of drafts", {}
    for name, settings in {"plain": dict(block_size=1), "tree": dict(tree_budget=16)}.items():
        repo = render_repository(RepoConfig(tiny_engine, tmp_path / name, num_threads=1, canary_tokens=0, **settings))
        with serve_on_free_ports(repo) as server:
            answers[name] = generate(server.config.http_url, prompt, 24)
    assert answers["tree"]["text_output"] == answers["plain"]["text_output"]
    assert answers["tree"]["num_output_tokens"] == 24


def test_the_manifest_says_which_methods_an_engine_verifies_and_the_repository_follows_it(tiny_engine, tmp_path):
    import json
    import shutil

    from dflash_trt.engine.manifest import read_manifest

    assert read_manifest(tiny_engine, verify=False)["verification"] == ["chain", "tree"]
    chain_only = tmp_path / "engine"
    shutil.copytree(tiny_engine, chain_only, symlinks=True)
    manifest = json.loads((chain_only / "manifest.json").read_text())
    manifest["verification"] = ["chain"]
    (chain_only / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(DFlashError, match="tree_budget: a torch engine verifies a chain only"):
        render_repository(RepoConfig(chain_only, tmp_path / "repo", tree_budget=8))
    render_repository(RepoConfig(chain_only, tmp_path / "repo", tree_budget=0))
