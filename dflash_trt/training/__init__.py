"""Drafter training: target answer generation, feature caching and the DFlash training recipe."""
