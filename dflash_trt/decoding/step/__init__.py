"""One decoding step of a running batch (step.py) and what it works on: requests (batch.py), sampling,
logits processors, acceptance and the verification methods (verify/)."""
