"""The drafter families, side by side: DFlash (dflash.py) and DFlash2 (dflash2.py) on shared pieces (base.py).

Each family file registers its class in registry.FAMILIES; this module imports them and offers the family-
independent operations: build, load and save a drafter, and the tensors a checkpoint must hold.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from dflash_trt.decoding.kernels.cpu_linear import pack_linear_layers
from dflash_trt.decoding.model.checkpoint import check_tensors, load_state_dict, save_state_dict
from dflash_trt.decoding.model.config import CONFIG_NAME, DrafterConfig
from dflash_trt.decoding.model.context_cache import ContextCache
from dflash_trt.decoding.model.drafters.base import DrafterBase, RMSNorm
from dflash_trt.decoding.model.drafters.dflash import DFlashDrafter
from dflash_trt.decoding.model.drafters.dflash2 import DFlash2Drafter
from dflash_trt.decoding.model.drafters.registry import FAMILIES
from dflash_trt.decoding.model.protocols import Proposal
from dflash_trt.errors import ConfigError

# The draft cache of the torch drafters (and of the exported ones): one class for every family.
DraftCache = ContextCache

__all__ = ["FAMILIES", "DFlashDrafter", "DFlash2Drafter", "DraftCache", "DrafterBase", "Proposal", "RMSNorm",
           "build_drafter", "drafter_class", "expected_shapes", "load_drafter", "save_drafter"]


def drafter_class(config: DrafterConfig) -> type[DrafterBase]:
    return FAMILIES[config.family]


def build_drafter(config: DrafterConfig) -> DrafterBase:
    """A drafter of `config`'s family with freshly initialised weights."""
    return drafter_class(config)(config)


def expected_shapes(config: DrafterConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor of a published drafter checkpoint of `config`'s family, with its shape."""
    return drafter_class(config).expected_shapes(config)


def load_drafter(path: str | Path, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
                 classes: dict[str, type[DrafterBase]] | None = None) -> DrafterBase:
    """Load a drafter directory in the published format (config.json + safetensors), either family.

    classes: family -> the class to build (a subclass of the family's; default FAMILIES)."""
    directory = Path(path)
    if not directory.is_dir():
        raise ConfigError(f"{directory}: drafter directory not found")
    config = DrafterConfig.from_file(directory / CONFIG_NAME)
    cls = (classes or FAMILIES)[config.family]
    tensors, source = load_state_dict(directory)
    aliases = cls.checkpoint_aliases()
    tensors = {aliases.get(name, name): t for name, t in tensors.items()}
    check_tensors(tensors, cls.expected_shapes(config), source)
    drafter = cls(config)
    drafter.load_state_dict(tensors, strict=True)
    drafter = drafter.to(device=device, dtype=dtype).eval()
    pack_linear_layers(drafter)  # CPU float32 inference: see cpu_linear.py
    return drafter


def save_drafter(drafter: DrafterBase, path: str | Path, dtype: torch.dtype | None = None) -> None:
    """Write `drafter` in the published format (config.json + model.safetensors)."""
    directory = Path(path)
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {name: (t.to(dtype) if dtype else t) for name, t in drafter.state_dict().items()}
    save_state_dict(tensors, directory)
    (directory / CONFIG_NAME).write_text(json.dumps(drafter.config.to_dict(), indent=2) + "\n")
