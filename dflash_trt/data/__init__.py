"""Prompt sets written for the project (drafter training data and benchmark held-out sets)."""

from dflash_trt.data.prompts import FAMILIES, build_prompt_sets, load_prompts, write_prompt_sets

__all__ = ["FAMILIES", "build_prompt_sets", "load_prompts", "write_prompt_sets"]
