"""Config-level compatibility of a drafter with its target (no weights are loaded).

Errors make the pair unusable (the drafter would read the wrong layers, embed with the wrong rows, or
project the wrong width); warnings are kept in the report and printed, but do not stop a build.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dflash_trt.decoding.model.config import DrafterConfig
from dflash_trt.engine.arch import TargetArch
from dflash_trt.errors import CompatibilityError


@dataclass
class CompatReport:
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def raise_if_errors(self, where: str) -> None:
        if self.errors:
            more = f" (and {len(self.errors) - 1} more: {'; '.join(self.errors[1:])})" if len(self.errors) > 1 else ""
            raise CompatibilityError(f"{where}: {self.errors[0]}{more}")


def check_pair(target: TargetArch, drafter: DrafterConfig, block_size: int, max_seq_len: int | None = None) -> CompatReport:
    """Every check of the pair; see check_compatible for the raising form."""
    report = CompatReport()
    _shapes(target, drafter, report)
    _layers(target, drafter, report)
    _rope(target, drafter, report)
    _block(drafter, block_size, report)
    if max_seq_len and drafter.max_position_embeddings and max_seq_len > drafter.max_position_embeddings:
        report.warnings.append(f"max_seq_len {max_seq_len} exceeds the drafter's max_position_embeddings "
                               f"{drafter.max_position_embeddings}")
    return report


def check_compatible(target: TargetArch, drafter: DrafterConfig, block_size: int, where: str,
                     max_seq_len: int | None = None) -> list[str]:
    """Raise CompatibilityError naming the first problem (and counting the others); return the warnings."""
    report = check_pair(target, drafter, block_size, max_seq_len)
    report.raise_if_errors(where)
    return report.warnings


def _shapes(target: TargetArch, drafter: DrafterConfig, report: CompatReport) -> None:
    if drafter.vocab_size != target.vocab_size:
        report.errors.append(f"drafter vocab_size {drafter.vocab_size} != target vocab_size {target.vocab_size}")
    if drafter.hidden_size != target.hidden_size:
        report.errors.append(f"drafter hidden_size {drafter.hidden_size} != target hidden_size {target.hidden_size} "
                             "(the drafter borrows the target's embedding and lm_head)")
    if not 0 <= drafter.mask_token_id < target.vocab_size:
        report.errors.append(f"mask_token_id {drafter.mask_token_id} is outside the target embedding "
                             f"({target.vocab_size} rows)")


def _layers(target: TargetArch, drafter: DrafterConfig, report: CompatReport) -> None:
    if drafter.num_target_layers != target.num_layers:
        report.errors.append(f"drafter was trained on a {drafter.num_target_layers}-layer target "
                             f"(num_target_layers), this target has {target.num_layers} layers")
    bad = [i for i in drafter.target_layer_ids if not 0 <= i < target.num_layers]
    if bad:
        report.errors.append(f"target_layer_ids {bad} are outside the target's layers 0..{target.num_layers - 1}")


def _rope(target: TargetArch, drafter: DrafterConfig, report: CompatReport) -> None:
    # The drafter rotates its own queries/keys at absolute target positions; published drafters copy
    # the target's RoPE. A different base means it was trained for another model.
    if abs(drafter.rope_theta - target.rope_theta) > 1e-6 * target.rope_theta:
        report.errors.append(f"drafter rope_theta {drafter.rope_theta:g} != target rope_theta {target.rope_theta:g}")
    t_kind, d_kind = _rope_kind(target.rope_scaling), _rope_kind(drafter.rope_scaling)
    if t_kind != d_kind:
        report.warnings.append(f"RoPE scaling differs: target {t_kind}, drafter {d_kind} (the drafter uses its own)")
        return
    if t_kind == "yarn":
        for key in ("factor", "original_max_position_embeddings"):
            t_val, d_val = target.rope_scaling.get(key), drafter.rope_scaling.get(key)
            if t_val != d_val:
                report.errors.append(f"YaRN {key}: drafter {d_val} != target {t_val}")


def _rope_kind(scaling) -> str:
    if not scaling:
        return "none"
    return str(scaling.get("rope_type", scaling.get("type", "default")))


def _block(drafter: DrafterConfig, block_size: int, report: CompatReport) -> None:
    if block_size > drafter.block_size:
        report.errors.append(f"block_size {block_size} is larger than the drafter's trained block_size "
                             f"{drafter.block_size} (slots past it were never trained)")
    elif block_size < drafter.block_size:
        report.warnings.append(f"block_size {block_size} is smaller than the drafter's trained "
                               f"{drafter.block_size}: fewer drafts per step")
