"""End-to-end drafter training: prompts -> target answers -> feature cache -> training -> export.

Every stage resumes from what is already on disk, so an interrupted `dflash-trt train-drafter`
simply runs again with the same arguments.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from dflash_trt.training.trainer import TrainConfig

PRESETS = {
    # The embedded demo pair: SmolLM2-135M-Instruct (30 layers, hidden 576) and a 2-layer drafter.
    # "answers": directories of committed greedy answers of the target, imported by the answers stage
    # instead of regenerated: the 5,804 template prompts (128-token cap, about 4 hours of a 2-core CPU)
    # and the 4,700 source prompts (data/prompts/sharegpt-*, champ-math; 384-token cap, in chunk files).
    # 10,504 = all training prompts (5,804 template + 4,700 source ones).
    "smollm2-135m": {"target": "smollm2", "max_prompts": 10504, "max_new_tokens": 384,
                     "out": "models/smollm2-135m-dflash",
                     "answers": "data/answers/smollm2-135m,data/answers/smollm2-135m-sources"},
}


@dataclass
class PipelineConfig:
    """What `dflash-trt train-drafter` runs; `train` holds the drafter and optimiser settings."""

    train: TrainConfig = field(default_factory=TrainConfig)
    out: str = "models/smollm2-135m-dflash"
    max_prompts: int = 3000
    max_new_tokens: int = 384
    answer_batch_size: int = 32
    eval_prompts_per_family: int = 8
    # Directories or glob patterns of answer files (comma-separated) imported before generating
    # (records must match the prompt order); with generate_answers False the answers stage only imports.
    answers_from: str | None = None
    # At most this many imported answers of these families in the data directory.
    import_per_family: dict[str, int] = field(default_factory=dict)
    generate_answers: bool = True
    stages: tuple[str, ...] = ("prompts", "answers", "features", "train", "export")


def run_pipeline(cfg: PipelineConfig) -> dict:
    """Run the requested stages; returns the final training/eval summary."""
    import torch

    from dflash_trt.training.answers import AnswerConfig, generate_answers, import_answers
    from dflash_trt.training.features import cache_features, load_feature_cache
    from dflash_trt.training.target_io import load_hf_target

    tc = cfg.train
    torch.set_num_threads(tc.threads)
    summary: dict = {}
    if "prompts" in cfg.stages and not Path(tc.prompts).exists():
        from dflash_trt.data.prompts import write_prompt_sets
        from dflash_trt.data.sources import write_source_prompt_sets
        from dflash_trt.errors import DFlashError

        write_prompt_sets(tc.prompts)
        try:
            write_source_prompt_sets(tc.prompts)
        except DFlashError as error:  # the `data` extra is optional: template prompts alone still train
            print(f"prompts: template families only ({error})")
    if "answers" in cfg.stages:
        t0 = time.time()
        for source in (cfg.answers_from or "").split(","):
            if source.strip():
                copied = import_answers(source.strip(), tc.data, tc.prompts, cfg.max_prompts,
                                        per_family=cfg.import_per_family)
                print(f"answers: imported {copied} answers from {source.strip()}")
        if cfg.generate_answers:
            generate_answers(AnswerConfig(prompts=tc.prompts, out=tc.data, target=tc.target,
                                          max_prompts=cfg.max_prompts, max_new_tokens=cfg.max_new_tokens,
                                          batch_size=cfg.answer_batch_size, threads=tc.threads))
        summary["answers_s"] = round(time.time() - t0, 1)
    if not {"features", "train", "export"} & set(cfg.stages):
        return summary
    model, tok = load_hf_target(tc.target)
    if "features" in cfg.stages:
        from dflash_trt.training.trainer import use_bf16

        # The same precision setting as training: bf16 where the CPU computes it natively.
        cache_features(tc.data, model, tc.target_layer_ids, bf16=use_bf16(tc.precision))
    if "train" in cfg.stages:
        samples = load_feature_cache(tc.data, tc.target_layer_ids)
        summary.update(train_on_cache(tc, samples, model, tok))
    if "export" in cfg.stages:
        summary.update(export(tc, cfg, model, tok))
    return summary


def make_evaluator(tc: TrainConfig, model, tok, per_family: int):
    """Callable drafter -> {tau, tau_<family>} on the first held-out prompts of each family."""
    from dflash_trt.decoding.model.target import TargetModel
    from dflash_trt.training.evaluate import heldout_prompt_ids, heldout_tau

    target = TargetModel(model, tok, source=tc.target)
    prompts = heldout_prompt_ids(tok, tc.prompts, per_family)
    return lambda drafter: heldout_tau(target, drafter, prompts, tc.eval_max_new_tokens, tc.stop_token_ids)


def train_on_cache(tc: TrainConfig, samples: list[dict], model, tok) -> dict:
    from dflash_trt.errors import DFlashError
    from dflash_trt.training.trainer import Trainer

    if not samples:
        raise DFlashError(f"{tc.data}: no cached training samples (run the answers and features stages)")
    emb = model.get_input_embeddings().weight
    head = model.get_output_embeddings().weight
    evaluate = make_evaluator(tc, model, tok, tc.eval_prompts_per_family)
    from dflash_trt.training.features import load_feature_cache

    trainer = Trainer(tc, samples, emb, head, model.config, evaluate, final_norm_weight=model.model.norm.weight,
                      refresh=lambda known: load_feature_cache(tc.data, tc.target_layer_ids, known))
    last = trainer.run()
    trained = trainer.samples  # with the samples the trainer picked up from the cache while it ran
    return {"steps": trainer.step, "train_s": round(trainer.elapsed, 1), "num_samples": len(trained),
            "num_response_tokens": sum(len(s["ids"]) - s["prompt_len"] for s in trained), "last": last}


def export(tc: TrainConfig, cfg: PipelineConfig, model, tok) -> dict:
    """Write the trained drafter to cfg.out (bf16 storage) and record its held-out tau next to the run."""
    import torch

    from dflash_trt.decoding.model.drafters import load_drafter, save_drafter

    save_drafter(load_drafter(Path(tc.out) / "drafter"), cfg.out, dtype=torch.bfloat16)
    result = make_evaluator(tc, model, tok, cfg.eval_prompts_per_family)(load_drafter(cfg.out))
    (Path(tc.out) / "export_eval.json").write_text(json.dumps(result, indent=2))
    return {"heldout": result}
