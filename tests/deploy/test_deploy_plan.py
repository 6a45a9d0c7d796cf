"""The make command lines the container runs, decided from arguments and what is on disk."""

from pathlib import Path

import pytest

from dflash_trt.deploy import plan
from dflash_trt.deploy.plan import DeployError, Ports, Target

PROJECT = Path("/opt/dflash-trt")


def _target(tmp_path: Path, model: str | None = "gpt-oss-120b", tp: int = 8) -> Target:
    return plan.resolve_target(tmp_path, model, tp)


def _build_engine(target: Target) -> None:
    target.engine_dir.mkdir(parents=True)
    (target.engine_dir / "manifest.json").write_text("{}")


def _render_repo(target: Target) -> None:
    (target.repo_dir / "ensemble").mkdir(parents=True)
    (target.repo_dir / "ensemble" / "config.pbtxt").write_text('name: "ensemble"')


def test_names_engine_and_repository_after_preset_and_tp(tmp_path):
    target = _target(tmp_path)
    assert target.engine_dir == tmp_path / "engines" / "gpt-oss-120b-tp8"
    assert target.repo_dir == tmp_path / "model_repository" / "gpt-oss-120b-tp8"


def test_explicit_paths_need_no_model(tmp_path):
    target = plan.resolve_target(tmp_path, None, 1, tmp_path / "e", tmp_path / "r")
    assert (target.engine_dir, target.repo_dir, target.model) == (tmp_path / "e", tmp_path / "r", None)


def test_rejects_missing_model_without_paths(tmp_path):
    with pytest.raises(DeployError, match="--model"):
        plan.resolve_target(tmp_path, None, 8)


@pytest.mark.parametrize("tp", [0, 3, 16])
def test_rejects_unsupported_tensor_parallel(tmp_path, tp):
    with pytest.raises(DeployError, match=f"tensor-parallel size {tp}"):
        _target(tmp_path, tp=tp)


def test_engine_command_passes_preset_tp_and_output(tmp_path):
    target = plan.resolve_target(tmp_path, "gpt-oss-120b", 8, runtime="trtllm")
    assert plan.engine_command(PROJECT, target) == [
        "make", "-C", "/opt/dflash-trt", "--no-print-directory", "engine",
        "MODEL=gpt-oss-120b", "TP=8", f"OUT={target.engine_dir}", "RUNTIME=trtllm",
    ]


def test_repo_command_points_at_engine_and_output(tmp_path):
    target = _target(tmp_path)
    assert plan.repo_command(PROJECT, target)[-3:] == [
        "repo", f"ENGINE={target.engine_dir}", f"OUT={target.repo_dir}",
    ]


def test_serve_command_binds_all_interfaces_with_the_three_ports_and_the_health_port(tmp_path):
    command = plan.serve_command(PROJECT, tmp_path / "repo", Ports())
    assert command[4:] == [
        "serve", f"REPO={tmp_path / 'repo'}", "HTTP_PORT=8000", "GRPC_PORT=8001", "METRICS_PORT=8002",
        "HEALTH_PORT=8003", "ADDRESS=0.0.0.0",
    ]


def test_serve_command_adds_openai_gateway_and_ready_timeout_when_asked(tmp_path):
    command = plan.serve_command(PROJECT, tmp_path, Ports(openai=9000), ready_timeout_s=1800)
    assert "OPENAI_PORT=9000" in command and "READY_TIMEOUT=1800" in command


@pytest.mark.parametrize("ports", [Ports(http=0), Ports(grpc=70000), Ports(metrics=8000), Ports(openai=8001),
                                   Ports(health=8000), Ports(health=0)])
def test_rejects_bad_or_clashing_ports(tmp_path, ports):
    with pytest.raises(DeployError, match="port"):
        plan.serve_command(PROJECT, tmp_path, ports)


def test_prepare_builds_engine_and_repository_when_nothing_exists(tmp_path):
    goals = [step[4] for step in plan.prepare_steps(PROJECT, _target(tmp_path))]
    assert goals == ["engine", "repo"]


def test_prepare_only_renders_repository_for_a_built_engine(tmp_path):
    target = _target(tmp_path)
    _build_engine(target)
    assert [step[4] for step in plan.prepare_steps(PROJECT, target)] == ["repo"]


def test_prepare_does_nothing_when_engine_and_repository_exist(tmp_path):
    target = _target(tmp_path)
    _build_engine(target)
    _render_repo(target)
    assert plan.prepare_steps(PROJECT, target) == []


def test_forced_prepare_rebuilds_engine_and_repository(tmp_path):
    target = _target(tmp_path)
    _build_engine(target)
    _render_repo(target)
    assert [step[4] for step in plan.prepare_steps(PROJECT, target, force=True)] == ["engine", "repo"]


def test_engine_directory_without_manifest_is_not_built(tmp_path):
    target = _target(tmp_path)
    target.engine_dir.mkdir(parents=True)  # an interrupted build leaves files but no manifest
    assert [step[4] for step in plan.prepare_steps(PROJECT, target)] == ["engine", "repo"]


def test_cannot_build_missing_engine_without_preset(tmp_path):
    target = plan.resolve_target(tmp_path, None, 1, tmp_path / "e", tmp_path / "r")
    with pytest.raises(DeployError, match="no engine at"):
        plan.prepare_steps(PROJECT, target)


def test_serve_prepares_missing_pieces_then_serves(tmp_path):
    goals = [step[4] for step in plan.serve_steps(PROJECT, _target(tmp_path), Ports())]
    assert goals == ["engine", "repo", "serve"]


def test_serve_without_build_uses_existing_repository_only(tmp_path):
    target = _target(tmp_path)
    _render_repo(target)
    assert [step[4] for step in plan.serve_steps(PROJECT, target, Ports(), build=False)] == ["serve"]


def test_serve_without_build_rejects_missing_repository(tmp_path):
    with pytest.raises(DeployError, match="no model repository"):
        plan.serve_steps(PROJECT, _target(tmp_path), Ports(), build=False)


@pytest.mark.parametrize(
    "version, expected", [("1.3.0", (1, 3)), ("1.3.0rc11", (1, 3)), ("v1.10.2", (1, 10)), ("0.21.0", (0, 21))]
)
def test_reads_release_from_version_strings(version, expected):
    assert plan.release_tuple(version) == expected


def test_rejects_unreadable_version():
    with pytest.raises(DeployError, match="cannot read a version"):
        plan.release_tuple("dev")


def test_version_key_orders_release_candidates_before_their_release():
    ordered = ["1.2.1", "1.3.0rc1", "1.3.0rc12", "1.3.0rc13", "1.3.0rc27", "1.3.0", "1.3.1", "1.4.0.dev2026",
               "1.4.0rc1", "v1.10.2"]
    assert sorted(ordered, key=plan.version_key) == ordered
    assert plan.version_key("1.3.0rc13") > plan.version_key("1.3.0rc9")  # numbers, not text
