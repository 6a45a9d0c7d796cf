"""A canary at model load: one short generation whose acceptance is logged and exported.

Acceptance collapse is silent: a drafter that does not match its target (another model, a broken
quantization, wrong layer ids) still produces correct text, only no speedup. So the dflash model runs two
generations when it loads, on a fixed prompt tokenized by the engine's own tokenizer (with its chat
template when it has one, as served prompts usually are): one greedy, one sampled at temperature
CANARY_TEMPERATURE with a fixed seed. It logs the acceptance each got, says plainly when one is near zero,
and exports them as the dflash_canary_* gauges (greedy) and dflash_canary_sampled_* gauges (T > 0).

The sampled one matters because acceptance at T > 0 can collapse while greedy looks fine: TensorRT-LLM
accepts sampled drafts by exact match unless speculative_config.use_rejection_sampling is on, and any
runtime's acceptance at T > 0 depends on how well the drafter matches the target's whole distribution.
The repository parameter canary_tokens sets the length of each; 0 turns the canary off.
"""

from __future__ import annotations

from dataclasses import dataclass

from dflash_trt.serving.generation import Stats
from dflash_trt.serving.requests import GenerationRequest

CANARY_PROMPT = "Explain in three sentences why the sky is blue, then name the scientist who first explained it."
DEFAULT_CANARY_TOKENS = 32
# Below this share of accepted drafts the drafter is not doing its job (a matched pair accepts 30-80 %).
NEAR_ZERO_ACCEPTANCE = 0.05
# The sampled canary: the temperature chat clients default to, a fixed seed so that reloads compare.
CANARY_TEMPERATURE = 1.0
CANARY_SEED = 0


@dataclass
class CanaryResult:
    """What the canary generation measured."""

    block_size: int
    num_spec_steps: int
    num_draft_tokens: int
    num_accepted_tokens: int
    num_output_tokens: int
    acceptance_rate: float
    tau: float
    temperature: float = 0.0

    @property
    def is_near_zero(self) -> bool:
        return self.num_draft_tokens > 0 and self.acceptance_rate < NEAR_ZERO_ACCEPTANCE


def canary_prompt_ids(tokenizer, prompt: str = CANARY_PROMPT) -> list[int]:
    """The prompt as the engine's tokenizer encodes it, through its chat template when it has one.

    A target without a tokenizer takes token ids only: the canary then runs on a fixed run of low ids."""
    if tokenizer is None:
        return list(range(1, 17))
    if getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True)
        ids = ids["input_ids"] if hasattr(ids, "keys") else ids
        return [int(t) for t in ids]
    return [int(t) for t in tokenizer.encode(prompt)]


def run_canary(runtime, num_tokens: int, prompt_ids: list[int] | None = None,
               temperature: float = 0.0) -> CanaryResult:
    """Generate num_tokens (no end id: the length is fixed), greedily or sampled at `temperature` with the
    canary's seed, and measure the acceptance."""
    prompt_ids = prompt_ids if prompt_ids is not None else canary_prompt_ids(runtime.tokenizer)
    request = GenerationRequest(CANARY_PROMPT, num_tokens, end_id=-1, temperature=temperature,
                                seed=CANARY_SEED if temperature > 0 else None)
    stats = Stats(runtime.block_size)
    steps = runtime.steps(prompt_ids, request, ())
    try:
        for step in steps:
            stats.add_step(step.acceptance_length, step.num_draft_tokens, step.num_accepted_drafts)
            stats.num_output_tokens += len(step.new_token_ids)
    finally:
        steps.close()
    return CanaryResult(runtime.block_size, stats.num_spec_steps, stats.total_draft_tokens,
                        stats.total_accepted_draft_tokens, stats.num_output_tokens, stats.acceptance_rate, stats.tau,
                        temperature)


def describe(result: CanaryResult) -> tuple[str, str]:
    """(log level, message) for a canary result."""
    mode = "greedy" if result.temperature == 0 else f"sampled at temperature {result.temperature:g}"
    measured = (f"{mode}: "f"{result.num_accepted_tokens} of {result.num_draft_tokens} draft tokens accepted "
                f"({result.acceptance_rate:.1%}) over {result.num_spec_steps} verify steps, tau {result.tau:.2f}, "
                f"block_size {result.block_size}, {result.num_output_tokens} tokens")
    if result.num_draft_tokens == 0:
        return "info", f"dflash canary: no drafts to measure (plain decoding), {result.num_output_tokens} tokens"
    if result.is_near_zero:
        advice = ("Check that the drafter belongs to this target (same model, tokenizer, layer ids) and that "
                  "its weights and quantization loaded as intended.")
        if result.temperature > 0:
            advice += (" If only the sampled canary is near zero: on the trtllm runtime check that the engine's "
                       "speculative_config sets use_rejection_sampling: true (else sampled drafts must match "
                       "exactly).")
        return "warn", (f"dflash canary: ACCEPTANCE NEAR ZERO at load: {measured}. The drafter's guesses are "
                        "almost never accepted, so speculative decoding gives no speedup (text is still correct). "
                        + advice)
    return "info", f"dflash canary: {measured}"


def check_at_load(runtime, num_tokens: int, metrics, logger) -> list[CanaryResult]:
    """The canary of the dflash model's initialize: run greedy and sampled, log through the backend's
    logger, export. Returns the results (greedy first; none when canary_tokens is 0)."""
    if num_tokens <= 0:
        logger.log_info("dflash canary: off (canary_tokens 0)")
        return []
    results = []
    for temperature in (0.0, CANARY_TEMPERATURE):
        try:
            result = run_canary(runtime, num_tokens, temperature=temperature)
        except Exception as error:  # a model that cannot generate must not come up as ready
            raise RuntimeError(f"dflash canary: the load-time generation (temperature {temperature:g}) failed: "
                               f"{error}") from error
        level, message = describe(result)
        getattr(logger, f"log_{level}")(message)
        metrics.canary(result.acceptance_rate, result.tau, temperature)
        results.append(result)
    return results
