"""The drafter API under its historical name; the families live in dflash_trt.drafters."""

from .drafters import (FAMILIES, DFlash2Drafter, DFlashDrafter, DraftCache, DrafterBase, Proposal, RMSNorm,
                       build_drafter, drafter_class, expected_shapes, load_drafter, save_drafter)
from .drafters.common import MLP, DraftAttention
from .drafters.v1 import DraftLayer

__all__ = ["FAMILIES", "DFlash2Drafter", "DFlashDrafter", "DraftAttention", "DraftCache", "DrafterBase",
           "DraftLayer", "MLP", "Proposal", "RMSNorm", "build_drafter", "drafter_class", "expected_shapes",
           "load_drafter", "save_drafter"]
