"""DFlash2 drafters in the engine builder: torch builds them (family in manifest.json), the other
runtimes refuse them in one line that names the torch runtime."""

import json

import pytest

from dflash_trt.engine.build import BuildRequest, build_engine
from dflash_trt.engine.presets import RUNTIMES, SHIPPED_CONFIGS as FIXTURES
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


@pytest.mark.parametrize("runtime", [r for r in RUNTIMES if r != "torch"])
def test_runtimes_without_dflash2_refuse_it_in_one_line(runtime, smollm2_dflash2_config, tmp_path):
    with pytest.raises(ConfigError) as info:
        build_engine(BuildRequest(model="smollm2-135m", runtime=runtime, checkpoints_dir=FIXTURES,
                                  drafter=smollm2_dflash2_config, out=tmp_path / "engine", dry_run=True), log=quiet)
    message = str(info.value)
    assert "DFlash2DraftModel" in message and "--runtime torch" in message and "\n" not in message


def test_torch_runtime_plans_a_dflash2_drafter(smollm2_dflash2_config, tmp_path):
    lines = []
    build_engine(BuildRequest(model="smollm2-135m", runtime="torch", checkpoints_dir=FIXTURES,
                              drafter=smollm2_dflash2_config, out=tmp_path / "engine", dry_run=True), log=lines.append)
    assert any("compatible: DFlash2DraftModel" in line for line in lines)
