"""Triton Inference Server integration: launcher, repository rendering, request translation, clients.

Modules import nothing heavy at import time so that Triton's Python backend, the CLI and the tests
can each take only the part they need.
"""
