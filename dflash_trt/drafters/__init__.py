"""The drafter families, side by side: DFlash (v1.py) and DFlash2 (v2.py) on shared pieces (common.py).

A family is a DrafterBase subclass with `family`, `layer_class`, `choose_drafts` and `expected_shapes`;
registering it in FAMILIES (keyed as config.ARCHITECTURES names it) is all a new variant needs.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ..checkpoint import check_tensors, load_state_dict, save_state_dict
from ..config import CONFIG_NAME, DrafterConfig
from ..cpu_linear import pack_linear_layers
from ..errors import ConfigError
from .common import DraftCache, DrafterBase, Proposal, RMSNorm
from .v1 import DFlashDrafter
from .v2 import DFlash2Drafter

FAMILIES: dict[str, type[DrafterBase]] = {"dflash": DFlashDrafter, "dflash2": DFlash2Drafter}

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


def load_drafter(path: str | Path, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu") -> DrafterBase:
    """Load a drafter directory in the published format (config.json + safetensors), either family."""
    directory = Path(path)
    if not directory.is_dir():
        raise ConfigError(f"{directory}: drafter directory not found")
    config = DrafterConfig.from_file(directory / CONFIG_NAME)
    cls = drafter_class(config)
    tensors, source = load_state_dict(directory)
    aliases = getattr(cls, "checkpoint_aliases", dict)()
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
