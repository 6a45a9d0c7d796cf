"""`dflash-trt train-drafter`: train a DFlash drafter for a target on its own greedy answers."""

from __future__ import annotations

from dflash_trt.errors import DFlashError

STAGES = ("prompts", "answers", "features", "train", "export")


def register(subparsers) -> None:
    from dflash_trt.training.pipeline import PRESETS
    from dflash_trt.training.trainer import ARCHS, PRECISIONS

    parser = subparsers.add_parser(
        "train-drafter", help="train a DFlash drafter (prompts -> target answers -> features -> training)",
        description="Every stage resumes from what its work directory already holds.")
    parser.add_argument("--model", default="smollm2-135m", choices=sorted(PRESETS), help="training preset")
    parser.add_argument("--target", help="target: Hugging Face directory or .gguf (default: the preset's)")
    parser.add_argument("--work", default="out/drafter", help="work directory (answers, features, checkpoints)")
    parser.add_argument("--out", help="where the trained drafter is written (default: the preset's)")
    parser.add_argument("--prompts", default="data/prompts", help="prompt sets root (<family>/{train,heldout}.jsonl)")
    parser.add_argument("--stages", default=",".join(STAGES), help=f"comma-separated subset of {','.join(STAGES)}")
    parser.add_argument("--max-prompts", type=int, help="training prompts to answer (default: the preset's)")
    parser.add_argument("--answers-from", metavar="SOURCE[,SOURCE...]",
                        help="import the target's answers from these directories (or glob patterns of answer "
                             "files) before generating the rest (default: the preset's committed answers, unless "
                             "--target is given; '' for none)")
    parser.add_argument("--import-per-family", metavar="FAMILY=N[,FAMILY=N...]", default="",
                        help="import at most N answers of these families (the first N prompts of each, a random "
                             "sample): a replay of old answers beside new ones, at a fraction of their feature pass")
    parser.add_argument("--import-only", action="store_true",
                        help="the answers stage imports answers and generates none: train on what exists")
    parser.add_argument("--max-new-tokens", type=int, help="answer length cap (default: the preset's)")
    parser.add_argument("--max-steps", type=int, default=4000)
    parser.add_argument("--max-minutes", type=float, default=55.0, help="training time budget (cosine schedule ends there)")
    parser.add_argument("--num-layers", type=int, default=2)
    parser.add_argument("--block-size", type=int, default=8)
    parser.add_argument("--arch", default="dflash", choices=ARCHS,
                        help="drafter family: dflash, or dflash2 (grouped convolutions + candidate selector, "
                             "starting from DFlash behaviour)")
    parser.add_argument("--init-from", metavar="DIR",
                        help="warm start from this published drafter (fresh optimiser and schedule); with "
                             "--num-layers above its depth, its layers are expanded by copies whose output "
                             "projections start at zero, so the run starts exactly where the drafter is")
    parser.add_argument("--lr", type=float, help="peak learning rate (default 1e-3)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the CPU is usually shared)")
    parser.add_argument("--precision", default="auto", choices=PRECISIONS,
                        help="training compute dtype; auto: bf16 where the CPU has native bf16 (default: auto)")
    parser.add_argument("--family-repeats", metavar="FAMILY=N[,FAMILY=N...]", default="",
                        help="each sample of these families appears N times per epoch (default: once), to weight "
                             "a small source against the template answers")
    parser.add_argument("--eval-every", type=int, default=400,
                        help="steps between held-out tau evaluations during training (default 400)")
    parser.set_defaults(func=run)


def parse_family_repeats(text: str, option: str = "--family-repeats") -> dict[str, int]:
    """'sharegpt-chat=4,champ-math=2' -> {'sharegpt-chat': 4, 'champ-math': 2}."""
    repeats = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        family, _, count = item.partition("=")
        if not family or not count.isdigit() or int(count) < 1:
            raise DFlashError(f"{option}: expected FAMILY=N with N >= 1, got {item!r}")
        repeats[family.strip()] = int(count)
    return repeats


def run(args) -> int:
    from dflash_trt.training.pipeline import PRESETS, PipelineConfig, run_pipeline
    from dflash_trt.training.trainer import TrainConfig

    stages = tuple(s.strip() for s in args.stages.split(",") if s.strip())
    unknown = sorted(set(stages) - set(STAGES))
    if unknown:
        raise DFlashError(f"unknown stages {unknown}; choose from {list(STAGES)}")
    preset = PRESETS[args.model]
    train = TrainConfig(data=f"{args.work}/data", out=f"{args.work}/train", prompts=args.prompts,
                        target=args.target or preset["target"], max_steps=args.max_steps,
                        max_minutes=args.max_minutes, num_layers=args.num_layers, block_size=args.block_size,
                        arch=args.arch, threads=args.threads, init_from=args.init_from, precision=args.precision,
                        eval_every=args.eval_every, family_repeats=parse_family_repeats(args.family_repeats))
    if args.lr is not None:
        train.lr = args.lr
    answers_from = args.answers_from
    if answers_from is None and not args.target:
        answers_from = preset.get("answers")
    cfg = PipelineConfig(train=train, out=args.out or preset["out"], stages=stages, answers_from=answers_from or None,
                         generate_answers=not args.import_only,
                         import_per_family=parse_family_repeats(args.import_per_family, "--import-per-family"),
                         max_prompts=args.max_prompts or preset["max_prompts"],
                         max_new_tokens=args.max_new_tokens or preset["max_new_tokens"])
    summary = run_pipeline(cfg)
    for key, value in summary.items():
        print(f"{key}: {value}")
    return 0
