"""vLLM's `--speculative-config` JSON, read once for every command that takes it.

    --speculative-config '{"method": "dflash", "model": "models/smollm2-135m-dflash", "num_speculative_tokens": 15}'

`model` is the drafter directory; the block size is num_speculative_tokens + 1 (the block's first slot
holds the last committed token). Omitting num_speculative_tokens uses the drafter's trained block size.
As in vLLM, DFlash2 drafters use the same method "dflash" (the checkpoint's architecture,
DFlash2DraftModel, selects the family); like vLLM, `method` may be omitted when the model path
contains "dflash" (vLLM's detection rule).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from dflash_trt.decoding.model.config import CONFIG_NAME, DrafterConfig
from dflash_trt.errors import ConfigError

METHOD = "dflash"
KEYS = ("method", "model", "num_speculative_tokens")
OPTION = "--speculative-config"


@dataclass(frozen=True)
class SpeculativeConfig:
    """A validated speculative config: the drafter directory and the block size to run it with."""

    drafter: Path
    block_size: int
    trained_block_size: int
    family: str = "dflash"

    @property
    def num_speculative_tokens(self) -> int:
        return self.block_size - 1


def parse_speculative_config(text: str) -> SpeculativeConfig:
    """Parse and check the JSON text of --speculative-config; raises ConfigError with one clear line."""
    data = _json_object(text)
    unknown = sorted(set(data) - set(KEYS))
    if unknown:
        raise ConfigError(f"{OPTION}: unknown key(s) {', '.join(map(repr, unknown))} (known: {', '.join(KEYS)})")
    method = data.get("method")
    if method is not None and (not isinstance(method, str) or method.lower() != METHOD):
        hint = ' (DFlash2 drafters run under method "dflash", as in vLLM)' if str(method).lower() == "dflash2" else ""
        raise ConfigError(f"{OPTION}: method {method!r} is not supported (only \"{METHOD}\"){hint}")
    model = data.get("model")
    if method is None and not (isinstance(model, str) and METHOD in model.lower()):
        raise ConfigError(f"{OPTION}: 'method' is missing (only \"{METHOD}\" is supported)")
    if not isinstance(model, str) or not model:
        raise ConfigError(f"{OPTION}: 'model' must name the DFlash drafter directory")
    drafter = Path(model)
    if not (drafter / CONFIG_NAME).is_file():
        raise ConfigError(f"{OPTION}: model {model!r} is not a local drafter directory (no {CONFIG_NAME})")
    config = DrafterConfig.from_file(drafter / CONFIG_NAME)  # names a non-DFlash architecture in one line
    trained = config.block_size
    return SpeculativeConfig(drafter, _block_size(data.get("num_speculative_tokens"), trained), trained,
                             config.family)


def _json_object(text: str) -> dict:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise ConfigError(f"{OPTION}: not valid JSON ({error.msg} at character {error.pos})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{OPTION}: expected a JSON object, got {type(data).__name__}")
    return data


def _block_size(num_speculative_tokens, trained: int) -> int:
    if num_speculative_tokens is None:
        return trained
    if isinstance(num_speculative_tokens, bool) or not isinstance(num_speculative_tokens, int) \
            or num_speculative_tokens < 1:
        raise ConfigError(f"{OPTION}: num_speculative_tokens must be a positive integer, "
                          f"got {num_speculative_tokens!r}")
    if num_speculative_tokens + 1 > trained:
        raise ConfigError(f"{OPTION}: num_speculative_tokens {num_speculative_tokens} means block size "
                          f"{num_speculative_tokens + 1}, beyond the drafter's trained block_size {trained} "
                          f"(use at most {trained - 1})")
    return num_speculative_tokens + 1


def apply_to_args(args, drafter_attr: str = "drafter", block_size_attr: str | None = "block_size") -> None:
    """Fill args.<drafter_attr> (and args.<block_size_attr>) from args.speculative_config, when given.

    The config replaces --drafter/--block-size; giving both is an error rather than a silent choice.
    """
    text = getattr(args, "speculative_config", None)
    if text is None:
        return
    spec = parse_speculative_config(text)
    for attr in (drafter_attr, block_size_attr):
        if attr and getattr(args, attr, None) is not None:
            raise ConfigError(f"{OPTION} replaces --{attr.replace('_', '-')}: give one of them")
    setattr(args, drafter_attr, spec.drafter)
    if block_size_attr:
        setattr(args, block_size_attr, spec.block_size)
    args.speculative = spec


def add_speculative_config_option(parser) -> None:
    parser.add_argument(OPTION, dest="speculative_config", metavar="JSON",
                        help='vLLM-style drafter setting, e.g. \'{"method": "dflash", "model": DRAFTER_DIR, '
                             '"num_speculative_tokens": 15}\' (block size = num_speculative_tokens + 1; '
                             'replaces --drafter and --block-size)')
