"""In-flight batching: admission, chunked prefill of newcomers, and the per-step block-size policy."""
