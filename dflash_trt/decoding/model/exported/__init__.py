"""Drafters run as exported graphs: ONNX (onnxruntime with the plugin's CPU op) and TensorRT engines."""
