"""Per-runtime engine artifacts: checkpoints (torch), drafter ONNX/TensorRT plan (onnx, tensorrt), LLM-API
options (trtllm)."""
