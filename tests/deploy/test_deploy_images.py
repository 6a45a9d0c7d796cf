"""The Dockerfiles parse, name pinned bases and run the entry point; checked without Docker."""

import re
from pathlib import Path

import pytest
from dockerfile_syntax import DockerfileError, base_images, find, parse

from dflash_trt.deploy.entrypoint import COMMANDS
from dflash_trt.engine.artifacts.trtllm_schema import MIN_TRTLLM_VERSION

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "deploy" / "docker"
GPU_BASE = re.compile(r"^nvcr\.io/nvidia/tritonserver:(\d\d)\.(\d\d)-trtllm-python-py3$")
CPU_BASE = re.compile(r"^python:3\.11\.\d+-slim(-[a-z]+)?$")


def _read(name: str):
    return parse((DOCKER / name).read_text())


@pytest.fixture(scope="module")
def gpu():
    return _read("gpu.Dockerfile")


@pytest.fixture(scope="module")
def cpu():
    return _read("cpu.Dockerfile")


def test_gpu_image_starts_from_a_pinned_triton_trtllm_tag(gpu):
    (image,) = base_images(gpu)
    year, month = map(int, GPU_BASE.match(image).groups())
    # Triton's compatibility table lists TensorRT-LLM 1.2.1 up to 26.07; DFlash serving needs >= 1.4.0rc4.
    assert (year, month) > (26, 7), image


def test_cpu_image_starts_from_a_pinned_python_slim_tag(cpu):
    (image,) = base_images(cpu)
    assert CPU_BASE.match(image), image


def test_gpu_dockerfile_states_the_tensorrt_llm_version_it_needs(gpu):
    text = (DOCKER / "gpu.Dockerfile").read_text()
    assert f"TensorRT-LLM >= {MIN_TRTLLM_VERSION}" in text and all(pr in text for pr in ("#17082", "#17701", "#18343"))
    check = [run.value for run in find(gpu, "RUN") if "check-runtime" in run.value]
    assert check and "MIN_TRTLLM_VERSION" in check[0]
    assert any(arg.value == f"MIN_TRTLLM_VERSION={MIN_TRTLLM_VERSION}" for arg in find(gpu, "ARG"))


def test_the_version_floor_is_the_newest_documented_release():
    from dflash_trt.deploy.plan import version_key

    # No tag holding #17082, #17701, #17955, #19161, #18401 and #18343 could be confirmed: the floor is the newest
    # documented release, whose DFlashDecodingConfig has every field the options write.
    assert MIN_TRTLLM_VERSION == "1.4.0rc4" and version_key("1.3.0rc27") < version_key(MIN_TRTLLM_VERSION)


@pytest.mark.parametrize("path", ["deploy/docker/requirements-gpu.txt", "deploy/README.md", "README.md",
                                  "docs/engines.md"])
def test_requirements_and_docs_name_the_same_floor(path):
    assert f">= {MIN_TRTLLM_VERSION}" in (ROOT / path).read_text()


def test_docs_name_the_same_base_images(gpu, cpu):
    readme = (ROOT / "deploy" / "README.md").read_text()
    for image in base_images(gpu) + base_images(cpu):
        assert image in readme


def test_gpu_image_builds_the_plugin(gpu):
    assert any(run.value.startswith("make plugins") for run in find(gpu, "RUN"))


@pytest.mark.parametrize("name", ["gpu.Dockerfile", "cpu.Dockerfile"])
def test_images_run_the_entrypoint_in_exec_form(name):
    instructions = _read(name)
    (entry,) = find(instructions, "ENTRYPOINT")
    (command,) = find(instructions, "CMD")
    assert entry.exec_form()[-2:] == ["-m", "dflash_trt.deploy.entrypoint"]
    assert command.exec_form()[0] in COMMANDS


@pytest.mark.parametrize("name", ["gpu.Dockerfile", "cpu.Dockerfile"])
def test_images_expose_triton_and_gateway_ports(name):
    ports = {word for expose in find(_read(name), "EXPOSE") for word in expose.value.split()}
    assert {"8000", "8001", "8002", "8003", "9000"} <= ports


@pytest.mark.parametrize("name", ["gpu.Dockerfile", "cpu.Dockerfile"])
def test_images_run_as_the_unprivileged_uid_the_chart_expects(name):
    instructions = _read(name)
    users = find(instructions, "USER")
    assert users and users[-1].value == "1000:1000"
    assert users[-1].line < find(instructions, "ENTRYPOINT")[0].line


@pytest.mark.parametrize("name", ["gpu.Dockerfile", "cpu.Dockerfile"])
def test_images_health_check_asks_triton_readiness(name):
    (health,) = find(_read(name), "HEALTHCHECK")
    assert health.exec_form()[-2:] == ["dflash_trt.deploy.entrypoint", "health"]


@pytest.mark.parametrize("name", ["gpu.Dockerfile", "cpu.Dockerfile"])
def test_images_mark_setup_done_so_make_never_reinstalls(name):
    assert any("touch .venv/.installed" in run.value for run in find(_read(name), "RUN"))


@pytest.mark.parametrize("name", ["gpu.Dockerfile", "cpu.Dockerfile"])
def test_build_context_leaves_out_local_venv_and_builds(name):
    ignored = (DOCKER / f"{name}.dockerignore").read_text().split()
    assert {".git", ".venv", "plugins/build", "engines/*"} <= set(ignored)


def _pins(lines) -> dict[str, str]:
    pins = {}
    for line in lines:
        line = line.split("#")[0].strip()
        if line:
            name, version = line.split("==")
            pins[re.sub(r"\[.*\]", "", name).lower()] = version
    return pins


def test_gpu_requirements_pin_what_pyproject_pins():
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        declared += [d for d in extra if "==" in d]
    gpu = _pins((DOCKER / "requirements-gpu.txt").read_text().splitlines())
    assert gpu, "requirements-gpu.txt pins nothing"
    assert {name: _pins(declared)[name] for name in gpu} == gpu


@pytest.mark.parametrize(
    "text, message",
    [
        ("FROM python:3.11.15-slim\nRUNN echo hi\n", "unknown instruction RUNN"),
        ("FROM python:3.11.15-slim\nCMD [\"serve\"\n", "not JSON"),
        ("RUN echo hi\nFROM python:3.11.15-slim\n", "RUN before the first FROM"),
        ("ARG BASE\nFROM ${BASE}\n", "no default"),
        ("FROM python:3.11.15-slim\nRUN echo \\\n", "continuation"),
        ("# just a comment\n", "no FROM"),
    ],
)
def test_reader_rejects_broken_dockerfiles(text, message):
    with pytest.raises(DockerfileError, match=message):
        base_images(parse(text))


def test_reader_joins_continuations_and_skips_comments_inside_them():
    instructions = parse("# syntax=docker/dockerfile:1\nFROM --platform=linux/amd64 a:1 AS x\n"
                         "RUN one \\\n  # note\n  && two\n")
    assert base_images(instructions) == ["a:1"]
    assert find(instructions, "RUN")[0].value == "one && two"
