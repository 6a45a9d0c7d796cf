"""Which request options the trtllm runtime can honour, decided once per engine; the rest are refused.

Under one-model speculative decoding (DFlash is one) TensorRT-LLM's sampler cannot apply some options:
- min_tokens and bad words: refused at admission since NVIDIA/TensorRT-LLM #17955 / #19161 / #18401
  (SpecSampler.validate_request, with min_p, an embedding bias and log probs); older releases dropped
  them without a trace;
- repetition / presence / frequency penalties: refused since #17701 unless
  `speculative_config.enable_penalty: true` (artifacts/trtllm.py writes it); older releases ignored them.
So a request asking for something this engine cannot honour gets one clear error naming the input (a 400
from Triton and from the OpenAI gateway), never a generation that silently lacks it. log probs, min_p and an
embedding bias never get here: the ensemble refuses them for every runtime (trtllm_inputs.py) and the
OpenAI gateway refuses them (gateway/protocol.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from dflash_trt.serving.requests import GenerationRequest

PENALTIES = {"repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0}  # name: neutral value


@dataclass(frozen=True)
class Admission:
    """What one trtllm engine honours. `why_no_penalties` is empty when penalties are applied."""

    speculative: bool  # one-model speculative decoding (a speculative_config) is on
    why_no_penalties: str = ""

    @classmethod
    def for_engine(cls, options: dict, installed_fields: frozenset[str], version: str = "") -> "Admission":
        """From the engine's LLM-API options and the installed DFlashDecodingConfig's fields."""
        spec = options.get("speculative_config")
        if not spec:
            return cls(speculative=False)
        release = f"TensorRT-LLM {version}".strip()
        if "enable_penalty" not in installed_fields:
            why = (f"the installed {release} has no speculative_config.enable_penalty, so it cannot apply "
                   "penalties under speculative decoding")
        elif not spec.get("enable_penalty"):
            why = ("this engine's speculative_config does not set enable_penalty: true (rebuild the engine "
                   "with `dflash-trt engine`, which sets it)")
        else:
            why = ""
        return cls(speculative=True, why_no_penalties=why)

    def refusal(self, request: GenerationRequest) -> str | None:
        """The one-line error for the first option of `request` this engine cannot honour, or None."""
        if not self.speculative:
            return None
        cannot = "TensorRT-LLM cannot apply it under speculative decoding (DFlash)"
        if request.min_tokens > 0:
            return (f"input 'min_tokens' = {request.min_tokens} is not supported by the trtllm runtime: {cannot}; "
                    "send 0 or leave it out")
        if request.bad_words:
            return (f"input 'bad_words' = {list(request.bad_words)!r} is not supported by the trtllm runtime: "
                    f"{cannot}; leave it out")
        if self.why_no_penalties:
            for name, neutral in PENALTIES.items():
                value = getattr(request, name)
                if value != neutral:
                    return (f"input '{name}' = {value:g} is not supported by this trtllm engine: "
                            f"{self.why_no_penalties}; send {neutral:g} or leave it out")
        return None
