"""The pure parts of `make bench-llamacpp` (benchmarks/llamacpp.py): token agreement and the report. The
llama.cpp runs themselves need its build (minutes), so they run in the benchmark, not here."""

from dflash_trt.benchmarks.llamacpp import agreement, markdown


def test_agreement_counts_positions_up_to_the_shorter_output_and_the_common_prefix():
    ours = [[1, 2, 3, 4], [5, 6, 7]]
    theirs = [[1, 2, 9, 4, 8], [5, 0]]
    result = agreement(ours, theirs)
    assert result["positions"] == 4 + 2
    assert result["agree"] == round(4 / 6, 3)  # 1, 2, 4 and 5
    assert result["mean_common_prefix"] == (2 + 1) / 2


def test_the_report_has_a_row_per_thread_count_and_the_ratios():
    level = {"threads": 1, "ours": {"plain_tok_s": 80.0, "dflash_tok_s": 70.0, "tau": 1.8},
             "llama_cpp": {"plain_tok_s": 100.0, "dflash_tok_s": 30.0, "dflash_tau": 1.9, "llama_bench_tok_s": 120.0},
             "batched": {"batch": 16, "ours": {"plain_tok_s": 500.0, "dflash_tok_s": 200.0},
                         "llama_cpp_plain_tok_s": 180.0}}
    text = markdown({"gguf": "m.gguf", "prompts": 8, "max_new_tokens": 96, "levels": [level],
                     "agreement_with_llama_cpp": {"positions": 10, "agree": 0.3, "mean_common_prefix": 2.0}})
    assert "| 1 | 100.0 | 120.0 | 80.0 | 0.80x | 70.0 (1.80) | 30.0 (1.90) |" in text
    assert "| 1 | 16 | 180.0 | 500.0 | 200.0 |" in text
    assert "against llama.cpp: 30% of 10 positions agree" in text
