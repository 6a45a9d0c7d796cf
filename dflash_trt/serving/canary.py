"""A canary at model load: short generations whose acceptance is logged and exported.

Acceptance collapse is silent: a drafter that does not match its target (another model, a broken
quantization, wrong layer ids) still produces correct text, only no speedup. So the dflash model runs the
canary when it loads, the way real requests run: a few real user prompts (held out from drafter training:
a question, a coding task, a math problem), each through the engine's own tokenizer and its chat template
when it has one (as `dflash-trt repo` serves by default). It runs them greedy, then sampled at temperature
CANARY_TEMPERATURE with a fixed seed, logs tau (tokens per verify step) and the accepted drafts, says
plainly when acceptance is near zero, and exports the dflash_canary_* gauges (greedy) and
dflash_canary_sampled_* gauges (T > 0).

"Near zero" is judged per verify step, not per draft token: at block 8 a healthy drafter that gets one
token of seven accepted per step has an acceptance rate of 14 %, which reads as broken but gives a real
speedup; a mismatched drafter gets almost no step with even one accepted draft.

The sampled one matters because acceptance at T > 0 can collapse while greedy looks fine: TensorRT-LLM
accepts sampled drafts by exact match unless speculative_config.use_rejection_sampling is on, and any
runtime's acceptance at T > 0 depends on how well the drafter matches the target's whole distribution.
The repository parameter canary_tokens sets the tokens generated per prompt; 0 turns the canary off.
"""

from __future__ import annotations

from dataclasses import dataclass

from dflash_trt.serving.generation import Stats
from dflash_trt.serving.requests import GenerationRequest

# Real user prompts from the held-out sets of data/prompts (chat, code, math): what served traffic looks like,
# not a sentence written to please the drafter.
CANARY_PROMPTS = (
    "Explain antibiotics in simple terms.",
    "Write a Go function that capitalizes the first letter of every word.",
    "Solve for x: 12x + 23 = 107.",
)
CANARY_PROMPT = CANARY_PROMPTS[0]
DEFAULT_CANARY_TOKENS = 16  # per prompt: 48 tokens over the three, greedy and again sampled
# Below this many accepted drafts per verify step (tau below 1.1) the drafter is not doing its job: fewer
# than one step in ten gets even one draft token accepted. The demo pair gets about one per step.
NEAR_ZERO_ACCEPTED_PER_STEP = 0.1
# The sampled canary: the temperature chat clients default to, a fixed seed so that reloads compare.
CANARY_TEMPERATURE = 1.0
CANARY_SEED = 0


@dataclass
class CanaryResult:
    """What the canary generations measured, summed over its prompts."""

    block_size: int
    num_spec_steps: int
    num_draft_tokens: int
    num_accepted_tokens: int
    num_output_tokens: int
    acceptance_rate: float
    tau: float
    temperature: float = 0.0
    num_prompts: int = 1

    @property
    def accepted_per_step(self) -> float:
        return self.num_accepted_tokens / max(self.num_spec_steps, 1)

    @property
    def is_near_zero(self) -> bool:
        return self.num_draft_tokens > 0 and self.accepted_per_step < NEAR_ZERO_ACCEPTED_PER_STEP


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
    """Generate num_tokens per prompt (no end id: the length is fixed), greedily or sampled at `temperature`
    with the canary's seed, and measure the acceptance over all of them. prompt_ids: one prompt instead of
    CANARY_PROMPTS."""
    if prompt_ids is not None:
        prompts = [prompt_ids]
    elif runtime.tokenizer is None:
        prompts = [canary_prompt_ids(None)]
    else:
        prompts = [canary_prompt_ids(runtime.tokenizer, text) for text in CANARY_PROMPTS]
    stats = Stats(runtime.block_size)
    for ids in prompts:
        request = GenerationRequest(CANARY_PROMPT, num_tokens, end_id=-1, temperature=temperature,
                                    seed=CANARY_SEED if temperature > 0 else None)
        steps = runtime.steps(ids, request, ())
        try:
            for step in steps:
                stats.add_step(step.acceptance_length, step.num_draft_tokens, step.num_accepted_drafts)
                stats.num_output_tokens += len(step.new_token_ids)
        finally:
            steps.close()
    return CanaryResult(runtime.block_size, stats.num_spec_steps, stats.total_draft_tokens,
                        stats.total_accepted_draft_tokens, stats.num_output_tokens, stats.acceptance_rate, stats.tau,
                        temperature, len(prompts))


def describe(result: CanaryResult) -> tuple[str, str]:
    """(log level, message) for a canary result."""
    mode = "greedy" if result.temperature == 0 else f"sampled at temperature {result.temperature:g}"
    measured = (f"{mode}: tau {result.tau:.2f} (tokens per verify step; 1.00 = no draft accepted), "
                f"{result.accepted_per_step:.2f} accepted drafts per step, {result.num_accepted_tokens} of "
                f"{result.num_draft_tokens} draft tokens accepted ({result.acceptance_rate:.1%}) over "
                f"{result.num_spec_steps} verify steps, block_size {result.block_size}, "
                f"{result.num_output_tokens} tokens from {result.num_prompts} prompt(s)")
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
