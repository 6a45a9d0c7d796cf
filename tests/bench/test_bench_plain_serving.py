"""The plain-decoding baseline is served the same way as DFlash: same engine, repository block_size 1."""

from __future__ import annotations

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from dflash_trt.errors import DFlashError
from dflash_trt.serving.repo import RepoConfig, render_repository
from dflash_trt.serving.runtime import open_runtime


def test_repository_carries_the_block_size_override(bench_engine, tmp_path):
    render_repository(RepoConfig(bench_engine, tmp_path, block_size=1))
    config = text_format.Parse((tmp_path / "dflash" / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
    assert config.parameters["block_size"].string_value == "1"


def test_block_size_one_runs_without_the_drafter(bench_engine):
    runtime = open_runtime(bench_engine, block_size=1)
    assert runtime.block_size == 1 and runtime.drafter is None


def test_default_block_size_is_the_engines(bench_engine):
    runtime = open_runtime(bench_engine)
    assert runtime.block_size == 4 and runtime.drafter is not None


def test_rejects_a_block_size_beyond_the_engines(bench_engine):
    with pytest.raises(DFlashError, match="exceeds the engine's 4"):
        open_runtime(bench_engine, block_size=5)
