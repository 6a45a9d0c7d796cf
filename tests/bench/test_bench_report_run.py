"""A short in-process benchmark run works and writes the documented summary.json and plots."""

from __future__ import annotations

import json

import pytest

from dflash_trt.benchmarks.config import BenchConfig, default_block_sizes
from dflash_trt.cli import main

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SUMMARY_KEYS = {"engine", "block_size", "machine", "settings", "tau", "speedup", "identical",
                "acceptance_histogram", "sweep", "per_family", "serving", "multi_turn"}
FIGURE_KEYS = {"block_size", "num_prompts", "tau", "speedup", "identical", "acceptance_histogram", "tpot_ms"}


@pytest.fixture(scope="module")
def short_run(bench_engine, bench_prompts, tmp_path_factory):
    out = tmp_path_factory.mktemp("bench-out")
    code = main(["bench-report", "--engine", str(bench_engine), "--out", str(out), "--prompts-dir", str(bench_prompts),
                 "--num-prompts", "2", "--max-new-tokens", "6", "--num-threads", "1", "--no-serving",
                 "--report", str(out / "results.md")])
    return code, out


def test_short_run_succeeds_and_writes_the_summary(short_run):
    code, out = short_run
    summary = json.loads((out / "summary.json").read_text())
    assert code == 0
    assert set(summary) == SUMMARY_KEYS and summary["serving"] is None
    assert summary["multi_turn"] is None  # the prompt sets hold no multi-turn conversations
    assert summary["block_size"] == 4 and summary["identical"] is True


def test_summary_has_figures_per_family_and_block_size(short_run):
    summary = json.loads((short_run[1] / "summary.json").read_text())
    assert set(summary["per_family"]) == {"math", "chat"}
    assert set(summary["sweep"]) == {"2", "4"}
    for family in summary["per_family"].values():
        assert FIGURE_KEYS <= set(family) and set(family["sweep"]) == {"2", "4"}
        assert family["num_prompts"] == 2
        assert set(family["acceptance_histogram"]) == {"1", "2", "3", "4"}
    assert summary["settings"]["block_sizes"] == [2, 4] and summary["settings"]["max_new_tokens"] == 6


def test_plots_are_png_files(short_run):
    for name in ("sweep.png", "acceptance_histogram.png"):
        assert (short_run[1] / name).read_bytes()[:8] == PNG_MAGIC, name
    assert not (short_run[1] / "serving.png").exists()


def test_prints_a_table_per_family_and_block_size(short_run, capsys):
    # The module fixture ran before capture of this test: run the table formatter on the written summary.
    from dflash_trt.benchmarks.report import format_table

    table = format_table(json.loads((short_run[1] / "summary.json").read_text()))
    assert "speedup" in table and "acceptance length histogram (block 4" in table
    assert sum(line.startswith(("math", "chat", "all")) for line in table.splitlines()) == 6


def test_rejects_a_block_size_beyond_the_engines(bench_engine, bench_prompts, tmp_path, capsys):
    code = main(["bench-report", "--engine", str(bench_engine), "--out", str(tmp_path), "--prompts-dir",
                 str(bench_prompts), "--block-sizes", "2,8", "--no-serving"])
    assert code == 2 and "block sizes [8] exceed the engine's block_size 4" in capsys.readouterr().err


def test_rejects_an_unknown_family(bench_engine, bench_prompts, tmp_path, capsys):
    code = main(["bench-report", "--engine", str(bench_engine), "--out", str(tmp_path), "--prompts-dir",
                 str(bench_prompts), "--families", "poetry", "--no-serving"])
    assert code == 2 and "no held-out prompts for family 'poetry' (known: chat, math)" in capsys.readouterr().err


def test_default_sweep_doubles_up_to_the_drafters_block_size():
    assert default_block_sizes(16) == (2, 4, 8, 16)
    assert default_block_sizes(10) == (2, 4, 8, 10)
    assert BenchConfig().concurrency == (1, 4, 16, 32) and BenchConfig().instances == 1


def test_multi_turn_and_text_prompt_families_share_one_table(bench_engine, tmp_path):
    """A family of chat-message prompts (data/prompts/sharegpt-multiturn's format) is benchmarked in process."""
    from dflash_trt.benchmarks.report import format_table

    prompts = tmp_path / "prompts"
    conversation = [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "Blue."},
                    {"role": "user", "content": "And another one?"}]
    for family, prompt in {"sharegpt-multiturn": conversation, "chat": "Say hello."}.items():
        (prompts / family).mkdir(parents=True)
        (prompts / family / "heldout.jsonl").write_text(json.dumps({"prompt": prompt, "family": family}) + "\n")
    out = tmp_path / "out"
    assert main(["bench-report", "--engine", str(bench_engine), "--out", str(out), "--prompts-dir", str(prompts),
                 "--num-prompts", "1", "--max-new-tokens", "4", "--num-threads", "1", "--block-sizes", "4",
                 "--no-serving"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["per_family"]) == {"sharegpt-multiturn", "chat"} and summary["identical"] is True
    assert any(line.startswith("sharegpt-multiturn") for line in format_table(summary).splitlines())
    # The multi-turn scenario ran on that conversation, both levels, without and with the cache.
    levels = summary["multi_turn"]["levels"]
    assert set(levels) == {"1", "8"} and all(level["output_differences"] == 0 for level in levels.values())
    assert "Multi-turn: 1 conversations" in format_table(summary)


def test_a_multi_turn_prompt_is_encoded_with_the_chat_template(bench_engine):
    from dflash_trt.decoding.model.tokens import encode_prompt
    from dflash_trt.engine import load_engine
    from dflash_trt.errors import DFlashError

    target = load_engine(bench_engine).target
    conversation = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
                    {"role": "user", "content": "Bye"}]
    ids = encode_prompt(target, conversation, chat=True)
    text = target.tokenizer.decode(ids)
    assert text.index("Hi") < text.index("Hello!") < text.index("Bye")
    assert encode_prompt(target, "Bye", chat=True) == encode_prompt(target, [conversation[-1]], chat=True)
    with pytest.raises(DFlashError, match="needs --chat"):
        encode_prompt(target, conversation, chat=False)
    with pytest.raises(DFlashError, match="ending on a user turn"):
        encode_prompt(target, conversation[:2], chat=True)


def test_served_table_shows_the_mean_block_size_and_plain_share_per_level():
    from dflash_trt.benchmarks.report import _serving_lines

    def level(drafting):
        return {"output_tokens_per_s": 50.0, "ttft_ms": {"p50": 1.0, "p99": 2.0}, "itl_ms": {"p50": 1.0, "p99": 2.0},
                "tpot_ms": 1.0, "user_tokens_per_s": {"min": 5.0}, "num_requests": 3, "num_errors": 0,
                "drafting": drafting}

    serving = {"dflash": {"1": level({"mean_block_size": 6.5, "plain_step_share": 0.0}),
                          "16": level({"mean_block_size": 1.25, "plain_step_share": 0.875})},
               "plain": {"1": level({"mean_block_size": 1.0, "plain_step_share": 1.0}), "16": level(None)},
               "speedup": {"1": 1.0, "16": 1.0}}
    lines = _serving_lines(serving, {"duration_s": 10.0, "instances": 1})
    header = lines[1].split()
    assert header[header.index("block"):header.index("block") + 2] == ["block", "plain"]
    rows = {tuple(line.split()[:2]): line.split() for line in lines[2:6]}
    assert rows[("dflash", "1")][-4:-2] == ["6.50", "0%"]
    assert rows[("dflash", "16")][-4:-2] == ["1.25", "88%"]
    assert rows[("plain", "1")][-4:-2] == ["1.00", "100%"]
    assert rows[("plain", "16")][-4:-2] == ["-", "-"]  # a level without verify steps


def test_the_markdown_report_states_provenance_and_the_figures_of_the_summary(short_run):
    import re

    from dflash_trt.benchmarks.markdown import current_commit

    out = short_run[1]
    summary, page = json.loads((out / "summary.json").read_text()), (out / "results.md").read_text()
    assert re.search(r"^- Date: \d{4}-\d\d-\d\d \d\d:\d\d UTC; commit `[0-9a-f]{7,}", page, re.M)
    assert current_commit().split()[0] in page
    assert f"{summary['machine']['num_cpus']} cores" in page and "load average (1/5/15 min)" in page
    command = re.search(r"```bash\n(.*)\n```", page).group(1)
    assert command.startswith("dflash-trt bench-report --engine ") and "--report" in command
    for family, data in summary["per_family"].items():
        for size, figures in data["sweep"].items():
            assert f"| {family} | {size} | {figures['tau']:.2f} | {figures['speedup']:.2f}x |" in page
    assert "## Served through Triton" not in page  # --no-serving


def test_the_markdown_report_has_the_served_table_when_serving_ran(short_run):
    from dflash_trt.benchmarks.markdown import results_page

    summary = json.loads((short_run[1] / "summary.json").read_text())
    level = {"output_tokens_per_s": 42.5, "ttft_ms": {"p50": 120.0, "p99": 300.0}, "itl_ms": {"p50": 30.0, "p99": None},
             "user_tokens_per_s": {"min": 9.5}, "drafting": {"mean_block_size": 3.25, "plain_step_share": 0.1},
             "num_requests": 7, "num_errors": 0}
    summary["serving"] = {"dflash": {"4": level}, "plain": {"4": {**level, "output_tokens_per_s": 21.25}},
                          "speedup": {"4": 2.0}}
    summary["settings"].update(duration_s=20.0, instances=1)
    summary["machine"].update(load_average_serving_start=[5.0, 4.0, 3.0], load_average_end=[6.0, 5.0, 4.0])
    page = results_page(summary, "dflash-trt bench-report --engine e", commit="abc1234")
    assert "5.0 / 4.0 / 3.0 when serving started, 6.0 / 5.0 / 4.0 at the end" in page
    assert "| dflash | 4 | 42.5 | 120 / 300 | 30 / - | 9.5 | 3.25 | 10% | 7 | 0 |" in page
    assert "| plain | 4 | 21.2 |" in page and "2.00x at concurrency 4" in page
    assert "counts the tokens streamed while the level's load was applied" in page
    assert "Counting the drain too" not in page  # a summary written before the drain was counted apart
    summary["serving"]["dflash"]["4"]["output_tokens_per_s_with_drain"] = 30.0
    summary["serving"]["plain"]["4"]["output_tokens_per_s_with_drain"] = 20.0
    page = results_page(summary, "dflash-trt bench-report --engine e", commit="abc1234")
    assert "Counting the drain too (every token, to the last completion), DFlash / plain: 1.50x at concurrency 4." \
        in page


def test_served_ratios_show_the_spread_of_their_rounds_when_several_ran():
    from dflash_trt.benchmarks.report import served_speedup

    serving = {"speedup": {"1": 1.02, "4": 0.99, "16": None},
               "speedup_runs": {"1": [0.96, 1.08, 1.01], "4": [0.99], "16": [None, None]}}
    assert served_speedup(serving, "1") == "1.02x (runs 0.96-1.08x, 95% CI 0.88-1.18x)"
    serving["speedup_runs"]["1"] = [0.96, 1.08]  # two rounds: a range, no interval (12.7 standard errors either side)
    assert served_speedup(serving, "1") == "1.02x (runs 0.96-1.08x)"
    assert served_speedup(serving, "4") == "0.99x"  # one round: nothing to spread
    assert served_speedup(serving, "16") == "-"
    assert served_speedup({"speedup": {"1": 1.1}}, "1") == "1.10x"  # summaries written before the runs were kept


def test_the_served_tables_say_how_many_runs_each_level_took():
    from dflash_trt.benchmarks.report import served_runs

    assert served_runs({"duration_s": 20.0, "serving_rounds": 3}) == "3 runs of 20 s per mode and level"
    assert served_runs({"duration_s": 30.0, "serving_rounds": 1}) == "30 s per level"
    assert served_runs({"duration_s": 2.5}) == "2.5 s per level"  # settings written before rounds existed
    assert served_runs({"duration_s": 20.0, "serving_rounds": 5, "max_new_tokens": 64, "served_length_spread": 0.25}
                       ) == "5 runs of 20 s per mode and level, requests of 48-80 tokens"


def test_the_plain_control_is_reported_beside_the_speedup_when_it_ran(short_run):
    from dflash_trt.benchmarks.markdown import results_page
    from dflash_trt.benchmarks.report import _serving_lines

    level = {"output_tokens_per_s": 40.0, "ttft_ms": {"p50": 1.0, "p99": 2.0}, "itl_ms": {"p50": 1.0, "p99": 2.0},
             "tpot_ms": 1.0, "user_tokens_per_s": {"min": 5.0}, "num_requests": 3, "num_errors": 0, "drafting": None}
    serving = {"dflash": {"1": level}, "plain": {"1": level}, "plain-control": {"1": {**level, "num_requests": 4}},
               "speedup": {"1": 1.0}, "speedup_runs": {"1": [0.9, 1.1]},
               "control": {"1": 1.05}, "control_runs": {"1": [1.02, 1.08]}}
    lines = _serving_lines(serving, {"duration_s": 20.0, "instances": 1})
    assert any(line.split()[:2] == ["plain-control", "1"] and line.split()[-2:] == ["4", "0"] for line in lines)
    assert "two plain servers (plain / plain-control, the comparison's resolution): c=1: 1.05x (runs 1.02-1.08x)" \
        in lines
    summary = json.loads((short_run[1] / "summary.json").read_text())
    summary["serving"] = serving
    summary["settings"].update(duration_s=20.0, instances=1, serving_rounds=2, served_length_spread=0)
    page = results_page(summary, "dflash-trt bench-report --engine e", commit="abc1234")
    assert "gRPC streaming, 2 runs of 20 s per mode and level, 1 dflash instance(s)" in page
    assert "| plain-control | 1 | 40.0 |" in page and "plain / plain-control" in page
    assert "1.05x (runs 1.02-1.08x) at concurrency 1" in page
    assert "95% CI" not in page  # two rounds: no interval, and nothing to explain
    serving["speedup_runs"]["1"] = [0.9, 1.1, 1.0]
    page = results_page(summary, "dflash-trt bench-report --engine e", commit="abc1234")
    assert "1.00x (runs 0.90-1.10x, 95% CI 0.78-1.28x) at concurrency 1" in page
    assert "95% CI: the interval of their mean (Student's t over their logarithms)" in page
    del serving["control"], serving["control_runs"], serving["plain-control"]
    assert not any("plain-control" in line for line in _serving_lines(serving, {"duration_s": 20.0, "instances": 1}))


def test_the_readme_table_is_rewritten_between_its_markers_only(short_run, tmp_path):
    from dflash_trt.benchmarks.markdown import README_END, README_START, headline_table, update_readme

    summary = json.loads((short_run[1] / "summary.json").read_text())
    readme = tmp_path / "README.md"
    readme.write_text(f"# Title\n\n{README_START}\nold figures\n{README_END}\n\n## After\n")
    table = headline_table(summary, "dflash-trt bench-report --engine e", "abc1234")
    update_readme(readme, table)
    text = readme.read_text()
    assert text.startswith("# Title\n\n") and text.endswith(f"{README_END}\n\n## After\n")
    assert "old figures" not in text and "commit `abc1234`" in text and "`dflash-trt bench-report --engine e`" in text
    for size, figures in summary["sweep"].items():
        assert f"| block {size}, all families | {figures['tau']:.2f} |" in text
    readme.write_text("# No markers\n")
    with pytest.raises(ValueError, match="has no results markers"):
        update_readme(readme, table)


def test_the_markdown_report_has_the_multi_turn_table_when_the_scenario_ran(short_run):
    from dflash_trt.benchmarks.markdown import results_page

    summary = json.loads((short_run[1] / "summary.json").read_text())
    run = {"ttft_ms_first_turn": {"p50": 400.0, "p99": 900.0}, "ttft_ms_later_turns": {"p50": 800.0, "p99": 1500.0},
           "output_tokens_per_s": 8.25, "tau": 1.91, "hit_rate": 0.0, "peak_cache_bytes": 0,
           "peak_cache_kv_bytes": 0, "within_budget": True}
    cached = {**run, "ttft_ms_later_turns": {"p50": 400.0, "p99": 700.0}, "hit_rate": 0.31,
              "peak_cache_bytes": 51 * 2**20, "peak_cache_kv_bytes": 40 * 2**20}
    summary["multi_turn"] = {"num_conversations": 8, "block_size": 8, "prefix_cache_bytes": 256 * 2**20,
                             "levels": {"1": {"no_cache": run, "cache": cached, "ttft_p50_speedup_later_turns": 2.0,
                                              "output_differences": 0, "acceptance_differences": 0}}}
    page = results_page(summary, "dflash-trt bench-report --engine e", commit="abc1234")
    assert "## Multi-turn conversations and the prefix cache" in page
    assert "| 1 | off | 400 / 900 | 800 / 1500 | 8.2 | 1.91 | 0% | 0.0 / 0.0 |" in page
    assert "| 1 | on | 400 / 900 | 400 / 700 | 8.2 | 1.91 | 31% | 51.0 / 40.0 |" in page
    assert "turns 2+ reach their first token 2.00x sooner" in page and "output differences 0" in page
