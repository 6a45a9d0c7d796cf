"""TensorRT-LLM engines are served as NVIDIA's Triton launcher does: tritonserver under `mpirun -n 1`
(or trtllm-llmapi-launch), and the model clears the OMPI/PMIx variables it inherits before creating the LLM."""

from __future__ import annotations

import json
import os
import string
import subprocess
import sys
import types
from pathlib import Path

import pytest

from dflash_trt.errors import DFlashError
from dflash_trt.serving import launcher
from dflash_trt.serving.repo import TEMPLATES, pbtxt_string
from dflash_trt.serving.server_config import ServerConfig, server_command

ROOT = Path(__file__).resolve().parents[2]
MPIRUN = ["mpirun", "--allow-run-as-root", "-n", "1"]


def repo_for(tmp_path: Path, runtime: str, engine_name: str = 'engine "tp8"') -> Path:
    """A repository whose dflash config.pbtxt is the real template, serving an engine of `runtime`."""
    engine = tmp_path / engine_name
    engine.mkdir()
    (engine / "manifest.json").write_text(json.dumps({"runtime": runtime}))
    values = {"engine_dir": pbtxt_string(str(engine)), "max_tokens_limit": 8, "max_context_tokens": 64,
              "device": "cuda", "num_threads": 0, "block_size": 0, "dflash_instances": 1, "max_queue_size": 4,
              "queue_timeout_us": 0, "canary_tokens": 0}
    text = string.Template((TEMPLATES / "dflash" / "config.pbtxt").read_text()).safe_substitute(values)
    (tmp_path / "repo" / "dflash").mkdir(parents=True)
    (tmp_path / "repo" / "dflash" / "config.pbtxt").write_text(text)
    return tmp_path / "repo"


@pytest.mark.parametrize("choice, runtime, prefix", [
    ("auto", "trtllm", MPIRUN), ("auto", "torch", []), ("auto", None, []), ("plain", "trtllm", []),
    ("mpirun", "torch", MPIRUN), ("trtllm-llmapi-launch", "trtllm", MPIRUN + ["trtllm-llmapi-launch"]),
])
def test_launcher_prefix(choice, runtime, prefix):
    assert launcher.launcher_prefix(choice, runtime) == prefix


def test_unknown_launcher_is_refused():
    with pytest.raises(DFlashError, match="launcher 'srun' is not one of auto, plain, mpirun"):
        launcher.launcher_prefix("srun", "trtllm")


def test_the_engine_is_found_through_the_rendered_dflash_config(tmp_path):
    repo = repo_for(tmp_path, "trtllm")
    assert launcher.repository_engine(repo) == tmp_path / 'engine "tp8"'  # escaped quotes read back
    assert launcher.launcher_for_repository("auto", repo) == MPIRUN
    assert launcher.launcher_for_repository("auto", tmp_path / "no-repo") == []


def test_tritonserver_command_line_under_mpirun():
    config = ServerConfig(Path("/repo"), launcher=tuple(MPIRUN))
    command = server_command(config, Path("/opt/tritonserver"))
    assert command[:5] == MPIRUN + ["/opt/tritonserver/bin/tritonserver"]
    assert "--model-repository=/repo" in command and "--http-port=8000" in command
    assert server_command(ServerConfig(Path("/repo")), Path("/t"))[0] == "/t/bin/tritonserver"


def test_serve_command_launches_trtllm_repositories_under_mpirun(tmp_path, monkeypatch):
    from dflash_trt.cli import main
    from dflash_trt.serving import supervisor

    seen = []
    monkeypatch.setattr(supervisor, "serve_forever", lambda config: seen.append(config) or 0)
    (tmp_path / "trtllm").mkdir()
    (tmp_path / "torch").mkdir()
    trtllm_repo, torch_repo = repo_for(tmp_path / "trtllm", "trtllm"), repo_for(tmp_path / "torch", "torch")
    assert main(["serve", "--repo", str(trtllm_repo), "--quiet"]) == 0
    assert main(["serve", "--repo", str(torch_repo), "--quiet"]) == 0
    assert main(["serve", "--repo", str(trtllm_repo), "--quiet", "--launcher", "trtllm-llmapi-launch"]) == 0
    assert [list(c.launcher) for c in seen] == [MPIRUN, [], MPIRUN + ["trtllm-llmapi-launch"]]


def test_a_missing_mpirun_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(launcher.shutil, "which", lambda name: None)
    with pytest.raises(DFlashError, match="mpirun is not installed.*--launcher plain"):
        launcher.require_launcher(MPIRUN)
    launcher.require_launcher([])  # plain needs nothing


def make_serve_line(*assignments: str) -> str:
    """The `dflash-trt serve` command `make serve` would run (make -n; STAMP=Makefile skips setup)."""
    out = subprocess.run(["make", "-n", "-C", str(ROOT), "--no-print-directory", "serve", "REPO=r",
                          "STAMP=Makefile", *assignments], capture_output=True, text=True, check=True).stdout
    (line,) = [line for line in out.replace("\\\n", " ").splitlines() if "dflash-trt serve" in line]
    return line


def test_make_serve_passes_the_launcher():
    assert "--launcher mpirun" in make_serve_line("LAUNCHER=mpirun")
    assert "--launcher auto" in make_serve_line()


def test_clears_the_mpi_job_identity_and_keeps_its_configuration():
    job = {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "1", "OMPI_UNIVERSE_SIZE": "1",
           "OMPI_MCA_orte_hnp_uri": "x", "ORTE_SESSION": "y", "PMIX_NAMESPACE": "x", "PMIX_RANK": "0",
           "PMI_RANK": "0", "PRTE_LAUNCHED": "1"}
    kept = {"OMPI_MCA_btl_vader_single_copy_mechanism": "none", "OMPI_ALLOW_RUN_AS_ROOT": "1",
            "PMIX_MCA_gds": "hash", "CUDA_VISIBLE_DEVICES": "0,1", "PATH": "/bin"}
    environ = {**job, **kept}
    assert launcher.clear_inherited_mpi_env(environ) == sorted(job)
    assert environ == kept


def test_the_trtllm_model_clears_mpi_variables_and_applies_env_overrides_before_the_llm(monkeypatch):
    from dflash_trt.serving.trtllm_runtime import TrtllmRuntime

    seen = {}
    module = types.ModuleType("tensorrt_llm")

    class LLM:
        def __init__(self, **options):
            seen["environ"], seen["options"] = dict(os.environ), options

        def shutdown(self):
            pass

    module.LLM, module.SamplingParams = LLM, dict
    monkeypatch.setitem(sys.modules, "tensorrt_llm", module)
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "1")
    monkeypatch.setenv("PMIX_RANK", "0")
    monkeypatch.delenv("TRTLLM_ENABLE_PDL", raising=False)
    options = {"model": "/m", "tensor_parallel_size": 8, "env_overrides": {"TRTLLM_ENABLE_PDL": "1"}}
    runtime = TrtllmRuntime(options, tokenizer=None, block_size=8)
    try:
        assert "OMPI_COMM_WORLD_SIZE" not in seen["environ"] and "PMIX_RANK" not in seen["environ"]
        assert seen["environ"]["TRTLLM_ENABLE_PDL"] == "1"
        assert seen["options"] == {"model": "/m", "tensor_parallel_size": 8}
    finally:
        runtime.close()
        os.environ.pop("TRTLLM_ENABLE_PDL", None)
