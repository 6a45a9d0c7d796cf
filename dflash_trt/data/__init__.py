"""Prompt sets: written for the project from templates, and cut from real prompt data (sources.py)."""

from dflash_trt.data.prompts import FAMILIES, build_prompt_sets, load_prompts, prompt_messages, write_prompt_sets

__all__ = ["FAMILIES", "build_prompt_sets", "load_prompts", "prompt_messages", "write_prompt_sets"]
