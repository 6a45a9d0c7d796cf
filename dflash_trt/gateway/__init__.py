"""OpenAI-compatible HTTP gateway in front of the Triton ensemble (`dflash-trt openai`).

A thin FastAPI app: it validates OpenAI requests, applies the target's chat template, and forwards
each generation to the `ensemble` model over gRPC streaming, so Triton stays the only serving engine.
presence_penalty and frequency_penalty keep the ensemble's TensorRT-LLM semantics, not OpenAI's: the
prompt's tokens count too, and they are subtracted after the temperature scaling (protocol.py).
Modules: errors (OpenAI error bodies), protocol (request validation), prompts (chat template, token
counts), responses (response and chunk objects), triton (the gRPC client), model (what is served),
app (routes, streaming, disconnects), companion (the gateway beside `dflash-trt serve`), aiperf_bench
(`make bench-aiperf`).
"""
