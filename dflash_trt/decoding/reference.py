"""The reference project's Python API on top of this project's drafter and decoding loop.

    draft = DFlashDrafter.from_pretrained(drafter_dir, dtype="auto", device_map="cpu").eval()
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype="auto", device_map="cpu").eval()
    output = draft.spec_generate(input_ids=input_ids, max_new_tokens=256, temperature=0.0, target=target,
                                 stop_token_ids=[tokenizer.eos_token_id])

`spec_generate` returns prompt + new tokens as one LongTensor [1, L + N], as the reference does: the
new tokens end at the first stop token (kept) or after max_new_tokens. Everything else (drafting,
verification, sampling) is `dflash_trt.decoding.api.generate`.

The public drafter classes (`dflash_trt.DFlashDrafter`, `dflash_trt.DFlash2Drafter`) are the model layer's
families plus this API (ReferenceAPI), so the model code never imports the decoding loop above it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Mapping

import torch

from dflash_trt.decoding.api import generate
from dflash_trt.decoding.model import drafters
from dflash_trt.decoding.model.config import CONFIG_NAME, DrafterConfig
from dflash_trt.decoding.model.target import TargetModel
from dflash_trt.decoding.step.sampling import SamplingParams
from dflash_trt.decoding.step.verify import tree_or_chain
from dflash_trt.errors import ConfigError, DFlashError

# The reference samples greedily below this temperature.
GREEDY_BELOW = 1e-5
_DTYPES = {"float32": torch.float32, "float": torch.float32, "bfloat16": torch.bfloat16,
           "float16": torch.float16, "half": torch.float16}


def from_pretrained(path: str | Path, dtype: str | torch.dtype = "auto", device_map=None,
                    trust_remote_code: bool | None = None):
    """Load a drafter directory (published DFlash format) the way `AutoModel.from_pretrained` is called.

    dtype: "auto" (the checkpoint's own dtype, float32 when it names none), a name or a torch.dtype.
    device_map: None or "cpu", "cuda", "cuda:N", an int, a torch.device, or "auto" (first GPU if any).
    trust_remote_code is accepted for compatibility and ignored: the drafter is this project's code.
    """
    directory = Path(path)
    if not (directory / CONFIG_NAME).is_file():
        raise ConfigError(f"{path}: not a local drafter directory (no {CONFIG_NAME}); this API loads local "
                          "directories only, download the checkpoint first")
    config = DrafterConfig.from_file(directory / CONFIG_NAME)
    return drafters.load_drafter(directory, dtype=resolve_dtype(dtype, config.raw),
                                 device=resolve_device(device_map), classes=PUBLIC_CLASSES)


def resolve_dtype(dtype: str | torch.dtype | None, raw_config: Mapping) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype in (None, "auto"):
        dtype = raw_config.get("dtype") or raw_config.get("torch_dtype") or "float32"
    name = str(dtype).removeprefix("torch.")
    if name not in _DTYPES:
        raise ConfigError(f"dtype {dtype!r} is not supported (use 'auto', {', '.join(sorted(_DTYPES))})")
    return _DTYPES[name]


def resolve_device(device_map) -> torch.device:
    if device_map is None:
        return torch.device("cpu")
    if isinstance(device_map, Mapping):
        raise ConfigError("device_map as a mapping (sharding) is not supported: the drafter runs on one device")
    if device_map == "auto":
        return torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    if isinstance(device_map, int):
        return torch.device("cuda", device_map)
    try:
        return torch.device(device_map)
    except (RuntimeError, TypeError):
        raise ConfigError(f"device_map {device_map!r} is not a device") from None


def spec_generate(drafter, target, input_ids, max_new_tokens: int, stop_token_ids: Iterable[int] | None = None,
                  temperature: float = 0.0, block_size: int | None = None, tree_budget: int = 0,
                  tree_top_k: int | None = None) -> torch.Tensor:
    """Speculative generation for one prompt; returns prompt + new tokens [1, L + N] on the prompt's device.

    target: a Hugging Face causal LM (or a dflash_trt TargetModel); input_ids: LongTensor [1, L] (or the
    BatchEncoding that `apply_chat_template(..., return_tensors="pt")` returns). tree_budget B > 0 verifies
    a tree of the drafter's B most probable continuations per step (tree_top_k candidates per slot) instead
    of the chain: the same tokens, more of them accepted per step (an extension; the reference has none).
    """
    prompt = _prompt_tensor(input_ids)
    target_model = _as_target(target)
    _check_placement(drafter, target_model)
    params = SamplingParams(
        max_new_tokens=int(max_new_tokens),
        temperature=0.0 if temperature is None or temperature < GREEDY_BELOW else float(temperature),
        stop_token_ids=tuple(int(t) for t in (stop_token_ids or ()) if t is not None),
    )
    method = tree_or_chain(tree_budget, tree_top_k)
    result = generate(target_model, drafter, [prompt[0].tolist()], params, block_size=block_size, method=method)[0]
    new_tokens = torch.tensor([result.token_ids], dtype=torch.long, device=prompt.device)
    return torch.cat([prompt.long(), new_tokens], dim=1)


def _prompt_tensor(input_ids) -> torch.Tensor:
    if isinstance(input_ids, Mapping) or hasattr(input_ids, "keys"):
        if "input_ids" not in input_ids:
            raise DFlashError("input_ids: a mapping was given without an 'input_ids' entry")
        input_ids = input_ids["input_ids"]
    if not isinstance(input_ids, torch.Tensor):
        input_ids = torch.tensor(input_ids, dtype=torch.long)
    if input_ids.dim() == 1:
        input_ids = input_ids[None, :]
    if input_ids.dim() != 2 or input_ids.shape[0] != 1:
        raise DFlashError(f"input_ids must have shape [1, L] (one prompt, as in the reference), "
                          f"got {list(input_ids.shape)}")
    if input_ids.shape[1] == 0:
        raise DFlashError("input_ids is empty")
    return input_ids


def _as_target(target):
    if isinstance(target, TargetModel):
        return target
    if not isinstance(target, torch.nn.Module):
        raise DFlashError(f"target must be a Hugging Face causal LM, got {type(target).__name__}")
    return TargetModel(target, tokenizer=None, source=type(target).__name__)


def _check_placement(drafter, target) -> None:
    """The drafter reads the target's embeddings and features: same dtype and device, or a clear error."""
    param = next(drafter.parameters())
    embed = target.model.get_input_embeddings().weight
    if param.dtype != embed.dtype:
        raise DFlashError(f"drafter dtype {param.dtype} differs from the target's {embed.dtype}: load both "
                          "with the same dtype")
    if param.device != embed.device:
        raise DFlashError(f"drafter is on {param.device}, the target on {embed.device}: use the same device_map")


class ReferenceAPI:
    """The reference project's methods on a drafter: `from_pretrained` and `spec_generate`."""

    @classmethod
    def from_pretrained(cls, path, dtype="auto", device_map=None, **kwargs):
        """Load a local drafter directory: `DFlashDrafter.from_pretrained(dir, dtype=..., device_map=...)`;
        the checkpoint's architecture picks the family (a DFlash2 checkpoint gives a DFlash2Drafter)."""
        return from_pretrained(path, dtype=dtype, device_map=device_map, **kwargs)

    def spec_generate(self, target, input_ids, max_new_tokens, stop_token_ids=None, temperature=0.0,
                      **kwargs) -> torch.Tensor:
        """Speculative generation with `target` (a Hugging Face causal LM); returns prompt + new tokens [1, L+N]."""
        return spec_generate(self, target, input_ids, max_new_tokens, stop_token_ids, temperature, **kwargs)


class DFlashDrafter(ReferenceAPI, drafters.DFlashDrafter):
    """The DFlash drafter with the reference project's API."""


class DFlash2Drafter(ReferenceAPI, drafters.DFlash2Drafter):
    """The DFlash2 drafter with the reference project's API."""


PUBLIC_CLASSES = {"dflash": DFlashDrafter, "dflash2": DFlash2Drafter}
