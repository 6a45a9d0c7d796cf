"""The target's tokenizer for text in and text out (preprocessing, postprocessing, gateway), and the token-id
range a request may use."""

from __future__ import annotations

from pathlib import Path

from dflash_trt.errors import DFlashError


def tokenizer_for(engine_dir: str | Path):
    """The target's tokenizer, without loading any weights (preprocessing, postprocessing, gateway).

    Text in and text out need the tokenizer files the target ships: without them this refuses
    rather than inventing a vocabulary."""
    from dflash_trt.decoding.model.target import TOKENIZER_FILES, load_tokenizer
    from dflash_trt.engine import load_engine

    # The dflash model verifies the file hashes; reading the manifest is enough here.
    engine = load_engine(engine_dir, verify=False, load_models=False)
    source = engine.target_path
    if engine.runtime == "trtllm":
        source = Path(engine.llm_options.get("tokenizer") or engine.llm_options["model"])
    tokenizer = load_tokenizer(source)
    if tokenizer is None:
        raise DFlashError(f"{engine_dir}: the target has no tokenizer (none of {', '.join(TOKENIZER_FILES)} in "
                          f"{source}), so text cannot be tokenized or detokenized; add the target's tokenizer "
                          "files, or send token ids to the dflash model")
    return tokenizer, engine


def vocabulary_size(runtime) -> int | None:
    """How many token ids a request may use: the tokenizer's vocabulary, else the target's embedding rows."""
    tokenizer = getattr(runtime, "tokenizer", None)
    if tokenizer is not None:
        return len(tokenizer)
    config = getattr(getattr(getattr(runtime, "target", None), "model", None), "config", None)
    return getattr(config, "vocab_size", None)
