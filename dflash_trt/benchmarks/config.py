"""BenchConfig: every setting of `make bench` with its one default."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dflash_trt.decoding.step.tree_budget import check_tree_budget
from dflash_trt.errors import DFlashError

REPO_ROOT = Path(__file__).resolve().parents[2]
PROMPTS_DIR = REPO_ROOT / "data" / "prompts"


@dataclass
class BenchConfig:
    """What to measure and how long. Empty tuples mean: derive (every family, 2, 4, 8 .. the engine's)."""

    engine: Path = REPO_ROOT / "engines" / "smollm2-135m"
    out: Path = REPO_ROOT / "out" / "bench"
    prompts_dir: Path = PROMPTS_DIR  # <dir>/<family>/heldout.jsonl
    families: tuple[str, ...] = ()
    num_prompts: int = 8  # per family
    max_new_tokens: int = 96
    block_sizes: tuple[int, ...] = ()
    chat: bool = True  # wrap prompts in the tokenizer's chat template (as the drafter was trained)
    num_threads: int = 0  # torch CPU threads in process and per dflash instance; 0: torch's choice
    serving: bool = True
    concurrency: tuple[int, ...] = (1, 4, 16, 32)
    duration_s: float = 30.0  # per concurrency level; requests started before the end are awaited
    # Served requests ask for max_new_tokens +- this share of it (a seeded sequence, the same for every server;
    # loadgen.request_lengths): real requests differ in length. 0: every request max_new_tokens.
    served_length_spread: float = 0.25
    serving_rounds: int = 1  # served runs per mode and level, the order of the modes changing from round to round
    instances: int = 1  # dflash model instances of each served repository (each batches in flight)
    # "Throughput at fixed interactivity": the best total tok/s of a level where every request still got
    # at least this many tok/s of its own.
    min_user_tokens_per_s: float = 10.0
    sequential_baseline: bool = False  # also serve DFlash one request at a time (max_batch_sequences 1)
    plain_control: bool = False  # also a second plain server: what two identical servers differ by (serving.py)
    tree_budget: int = 0  # served DFlash: the repository's tree_budget (the adaptive policy's largest tree)
    # The multi-turn scenario (multi_turn.py): conversations replayed turn by turn, without and with the prefix
    # cache, at each of multi_turn_concurrency.
    multi_turn: bool = True
    multi_turn_conversations: int = 8
    multi_turn_concurrency: tuple[int, ...] = (1, 8)
    prefix_cache_bytes: int = 256 * 2**20  # the prefix cache's budget in the multi-turn scenario (as served)
    request_timeout_s: float = 600.0
    ready_timeout_s: float = 600.0

    @property
    def served_length_spread_tokens(self) -> int:
        """The spread of served requests' max tokens, in tokens."""
        return spread_tokens(self.served_length_spread, self.max_new_tokens)

    def validate(self) -> None:
        for name in ("num_prompts", "max_new_tokens", "instances", "multi_turn_conversations", "prefix_cache_bytes",
                     "serving_rounds"):
            if getattr(self, name) < 1:
                raise DFlashError(f"{name} must be >= 1, got {getattr(self, name)}")
        check_tree_budget(self.tree_budget)
        if self.num_threads < 0:
            raise DFlashError(f"num_threads must be >= 0, got {self.num_threads}")
        if any(size < 2 for size in self.block_sizes):
            raise DFlashError(f"block sizes must be >= 2 (1 is the baseline, always run), got {self.block_sizes}")
        if not self.concurrency or any(level < 1 for level in self.concurrency):
            raise DFlashError(f"concurrency levels must be >= 1, got {self.concurrency}")
        if self.multi_turn and (not self.multi_turn_concurrency or any(c < 1 for c in self.multi_turn_concurrency)):
            raise DFlashError(f"multi-turn concurrency levels must be >= 1, got {self.multi_turn_concurrency}")
        if self.min_user_tokens_per_s < 0:
            raise DFlashError(f"min_user_tokens_per_s must be >= 0, got {self.min_user_tokens_per_s}")
        if not 0 <= self.served_length_spread < 1:
            raise DFlashError(f"served_length_spread must be in [0, 1), got {self.served_length_spread}")
        if self.duration_s <= 0:
            raise DFlashError(f"duration_s must be > 0, got {self.duration_s}")


def default_block_sizes(max_block_size: int) -> tuple[int, ...]:
    """2, 4, 8, ... below the drafter's block size, then the drafter's own."""
    sizes, size = [], 2
    while size < max_block_size:
        sizes.append(size)
        size *= 2
    return (*sizes, max_block_size) if max_block_size >= 2 else ()


def resolve_block_sizes(requested: tuple[int, ...], max_block_size: int) -> tuple[int, ...]:
    if not requested:
        return default_block_sizes(max_block_size)
    too_large = [size for size in requested if size > max_block_size]
    if too_large:
        raise DFlashError(f"block sizes {too_large} exceed the engine's block_size {max_block_size}")
    return tuple(sorted(set(requested)))


def spread_tokens(share: float, max_new_tokens: int) -> int:
    """A share of max_new_tokens as the spread of served requests' lengths, in tokens (whole tokens, rounded down)."""
    return int(share * max_new_tokens)
