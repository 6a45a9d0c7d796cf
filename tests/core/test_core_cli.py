import json

import pytest
import torch

from dflash_trt.cli import main


def test_generate_prints_one_json_object(tiny_pair_dir, capsys):
    code = main(["generate", "--target", str(tiny_pair_dir / "target"), "--drafter", str(tiny_pair_dir / "drafter"),
                 "--prompt-ids", "1,2,3", "--max-new-tokens", "13", "--json"])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["token_ids"]) == 13 and out["text"] is None
    assert out["block_size"] == 8 and 1 <= out["tau"] <= 8
    assert len(out["acceptance_lengths"]) >= 2


def test_generate_block_size_1_equals_dflash(tiny_pair_dir, capsys):
    args = ["generate", "--target", str(tiny_pair_dir / "target"), "--drafter", str(tiny_pair_dir / "drafter"),
            "--prompt-ids", "4,5,6,7", "--max-new-tokens", "11", "--json", "--stop-ids", "17"]
    main(args)
    dflash = json.loads(capsys.readouterr().out)
    main(args + ["--block-size", "1"])
    plain = json.loads(capsys.readouterr().out)
    assert dflash["token_ids"] == plain["token_ids"]
    assert plain["tau"] == 1.0


def test_generate_with_a_tree_equals_plain_decoding(tiny_pair_dir, capsys):
    args = ["generate", "--target", str(tiny_pair_dir / "target"), "--drafter", str(tiny_pair_dir / "drafter"),
            "--prompt-ids", "4,5,6,7", "--max-new-tokens", "11", "--json"]
    main(args + ["--block-size", "1"])
    plain = json.loads(capsys.readouterr().out)
    for tree in (["--tree-budget", "16"], ["--tree-budget", "5", "--tree-top-k", "2"]):
        assert main(args + tree) == 0
        assert json.loads(capsys.readouterr().out)["token_ids"] == plain["token_ids"]


def test_generate_runs_a_dflash2_drafter(tiny_pair_dir, tmp_path, capsys):
    from transformers import AutoConfig

    from dflash_trt.testing import make_tiny_drafter

    target = str(tiny_pair_dir / "target")
    make_tiny_drafter(AutoConfig.from_pretrained(target), tmp_path / "dflash2", family="dflash2", block_size=6,
                      sliding_window=8, is_causal=False, final_logit_softcapping=30.0)
    base = ["--target", target, "--max-new-tokens", "11", "--json"]
    main(["generate", *base, "--drafter", str(tmp_path / "dflash2"), "--prompt-ids", "4,5,6,7"])
    dflash2 = json.loads(capsys.readouterr().out)
    main(["generate", *base, "--prompt-ids", "4,5,6,7"])  # no drafter: plain decoding
    assert dflash2["token_ids"] == json.loads(capsys.readouterr().out)["token_ids"]
    assert dflash2["block_size"] == 6 and sum(dflash2["acceptance_lengths"]) == 10  # 11 minus the prefill token
    spec = json.dumps({"method": "dflash", "model": str(tmp_path / "dflash2"), "num_speculative_tokens": 3})
    main(["generate", *base, "--speculative-config", spec, "--prompt-ids", "4,5,6,7"])
    via_spec = json.loads(capsys.readouterr().out)
    assert via_spec["token_ids"] == dflash2["token_ids"] and via_spec["block_size"] == 4


@pytest.mark.parametrize("args, message", [
    (["--drafter", "/nonexistent/drafter"], "drafter directory not found"),
    (["--prompt", "hello"], "has no tokenizer"),
    (["--temperature", "-1"], "temperature must be >= 0"),
    (["--min-tokens", "-1"], "min_tokens must be >= 0, got -1"),
    (["--repetition-penalty", "0"], "repetition_penalty must be a finite number > 0, got 0"),
    (["--frequency-penalty", "nan"], "frequency_penalty must be a finite number, got nan"),
    (["--bad-words", "foo"], "bad_words need the target's tokenizer"),
    (["--tree-budget", "-1"], "tree budget must be >= 0 (0 means the chain), got -1"),
    (["--tree-top-k", "4"], "--tree-top-k needs --tree-budget B > 0"),
    (["--tree-budget", "8", "--tree-top-k", "0"], "tree top-k must be >= 1, got 0"),
])
def test_generate_reports_user_errors_in_one_line(tiny_pair_dir, capsys, args, message):
    base = {"--target": str(tiny_pair_dir / "target"), "--drafter": str(tiny_pair_dir / "drafter"),
            "--prompt-ids": "1,2", "--max-new-tokens": "4"}
    if "--prompt" in args:
        del base["--prompt-ids"]
    for flag, value in zip(args[::2], args[1::2]):
        base[flag] = value
    code = main(["generate", *[item for pair in base.items() for item in pair]])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: ") and message in err and "Traceback" not in err


def test_generate_logits_flags_change_the_output_and_equal_plain_decoding(tiny_text_pair_dir, capsys):
    from transformers import AutoTokenizer

    pair = tiny_text_pair_dir
    base = ["generate", "--target", str(pair / "target"), "--drafter", str(pair / "drafter"),
            "--prompt", "The capital of France is", "--max-new-tokens", "12", "--json", "--stop-ids", ""]

    def tokens(*flags) -> list[int]:
        assert main([*base, *flags]) == 0
        return json.loads(capsys.readouterr().out)["token_ids"]

    plain = tokens()
    word = AutoTokenizer.from_pretrained(str(pair / "target")).decode(plain[3:5])  # in the answer
    stop = ["--stop-ids", str(plain[2])]  # an early stop, for --min-tokens to hold back
    stopped = tokens(*stop)
    assert stopped == plain[:3]
    answers = {}
    for flags, without in ((["--bad-words", word], plain), ([*stop, "--min-tokens", "8"], stopped),
                           # the random target never repeats a token: only penalties that reward repetition
                           # change its answer
                           (["--repetition-penalty", "0.5"], plain), (["--presence-penalty", "-1"], plain),
                           (["--frequency-penalty", "-1"], plain)):
        answers[flags[-2]] = dflash = tokens(*flags)
        assert dflash != without, flags  # the control changes the answer
        assert dflash == tokens(*flags, "--block-size", "1"), flags  # and DFlash keeps plain decoding's
    assert len(answers["--min-tokens"]) >= 8


def test_bench_reports_tau_speedup_and_identity(tiny_text_pair_dir, tmp_path, capsys):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "Count to five.", "family": "chat"}\nplain text line\n')
    code = main(["bench", "--target", str(tiny_text_pair_dir / "target"), "--drafter",
                 str(tiny_text_pair_dir / "drafter"), "--prompts", str(prompts), "--max-new-tokens", "6", "--json"])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert out["num_prompts"] == 2 and out["identical"] is True
    assert out["tau"] >= 1.0 and out["speedup"] > 0
    assert sum(out["acceptance_histogram"].values()) > 0 and set(out["acceptance_histogram"]) == {"1", "2", "3", "4"}
    assert out["tree_budget"] == 0
    # Every linear layer of the target once per step (float32 here), and tau tokens per DFlash step.
    from dflash_trt.decoding.model.target import load_target
    linears = [m for m in load_target(tiny_text_pair_dir / "target").model.modules() if isinstance(m, torch.nn.Linear)]
    traffic = out["memory_traffic"]
    assert traffic["weight_mb_per_step"] == pytest.approx(sum(4 * m.weight.numel() for m in linears) / 1e6)
    assert traffic["mb_per_token"]["dflash"] == pytest.approx(traffic["weight_mb_per_step"] / out["tau"])
    main(["bench", "--target", str(tiny_text_pair_dir / "target"), "--drafter", str(tiny_text_pair_dir / "drafter"),
          "--prompts", str(prompts), "--max-new-tokens", "6", "--json", "--tree-budget", "12"])
    tree = json.loads(capsys.readouterr().out)
    assert tree["tree_budget"] == 12 and tree["identical"] is True
    main(["bench", "--target", str(tiny_text_pair_dir / "target"), "--drafter", str(tiny_text_pair_dir / "drafter"),
          "--prompts", str(prompts), "--max-new-tokens", "6", "--json", "--tree-budget", "12",
          "--block-policy", "adaptive"])
    adaptive = json.loads(capsys.readouterr().out)
    assert adaptive["block_policy"] == "adaptive" and adaptive["identical"] is True
    # One policy across the prompts (and the warm-up): a chain first, then plain, then each tree budget once.
    assert {"chain 4", "plain", "tree 4", "tree 8", "tree 12"} <= set(adaptive["plans"]), adaptive["plans"]


def test_bench_rejects_a_malformed_prompt_file(tiny_text_pair_dir, tmp_path, capsys):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"text": "no prompt field"}\n')
    code = main(["bench", "--target", str(tiny_text_pair_dir / "target"), "--drafter",
                 str(tiny_text_pair_dir / "drafter"), "--prompts", str(prompts), "--max-new-tokens", "6"])
    assert code == 2 and "prompts.jsonl:1: expected a JSON object with a 'prompt' field" in capsys.readouterr().err
