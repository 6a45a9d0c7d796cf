"""Reading and writing safetensors checkpoints, single-file or sharded with an index."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from dflash_trt.errors import CheckpointError

WEIGHTS_NAME = "model.safetensors"
INDEX_NAME = "model.safetensors.index.json"


def load_state_dict(directory: Path) -> tuple[dict[str, torch.Tensor], str]:
    """Every tensor of the checkpoint in `directory`, and the file name to cite in errors."""
    single, index = directory / WEIGHTS_NAME, directory / INDEX_NAME
    if single.is_file():
        return _read(single), str(single)
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError) as exc:
            raise CheckpointError(f"{index}: not a safetensors index ({exc})") from None
        tensors: dict[str, torch.Tensor] = {}
        for shard in sorted(set(weight_map.values())):
            path = directory / shard
            if not path.is_file():
                raise CheckpointError(f"{index}: shard '{shard}' is missing")
            tensors.update(_read(path))
        return tensors, str(index)
    raise CheckpointError(f"{directory}: no {WEIGHTS_NAME} or {INDEX_NAME}")


def save_state_dict(tensors: dict[str, torch.Tensor], directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    save_file({name: t.detach().contiguous().cpu() for name, t in tensors.items()},
              str(directory / WEIGHTS_NAME), metadata={"format": "pt"})


def check_tensors(tensors: dict[str, torch.Tensor], expected: dict[str, tuple[int, ...]], source: str) -> None:
    """Raise naming the first missing, unknown or mis-shaped tensor."""
    missing = sorted(set(expected) - set(tensors))
    if missing:
        raise CheckpointError(f"{source}: tensor '{missing[0]}' is missing"
                              + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    unknown = sorted(set(tensors) - set(expected))
    if unknown:
        raise CheckpointError(f"{source}: unknown tensor '{unknown[0]}'"
                              + (f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else ""))
    for name, shape in expected.items():
        if tuple(tensors[name].shape) != shape:
            raise CheckpointError(f"{source}: tensor '{name}' has shape {list(tensors[name].shape)}, "
                                  f"expected {list(shape)}")


def _read(path: Path) -> dict[str, torch.Tensor]:
    try:
        with safe_open(str(path), framework="pt") as handle:
            return {name: handle.get_tensor(name) for name in handle.keys()}
    except Exception as exc:  # safetensors raises its own error types for truncated or foreign files
        raise CheckpointError(f"{path}: cannot read safetensors file ({exc})") from None
