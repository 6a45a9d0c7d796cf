"""`make gpu-check` without a GPU: it refuses in one line with a non-zero exit and writes nothing; its pure parts
(speedup and bandwidth maths, table, JSON, section handling) work."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dflash_trt.gpu_check import report
from dflash_trt.gpu_check.__main__ import refusal, timed
from dflash_trt.gpu_check.report import Section
from dflash_trt.gpu_check.sanitizer import sanitizer_command

REPO = Path(__file__).resolve().parents[2]
needs_no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")


@needs_no_gpu
def test_refuses_in_one_line_with_a_nonzero_exit_and_writes_nothing(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "dflash_trt.gpu_check", "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu-check:") and "nothing was run" in lines[0]
    assert not (tmp_path / "out").exists()


@needs_no_gpu
def test_make_target_refuses_the_same_way(tmp_path):
    proc = subprocess.run(["make", "-s", "gpu-check", f"GPU_PYTHON={sys.executable}", f"OUT={tmp_path / 'o'}"],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode != 0 and proc.stdout == ""
    assert [line for line in proc.stderr.splitlines() if line.startswith("gpu-check:")] == [refusal()]


def test_implied_speedup_reproduces_the_papers_figure():
    # tau 6.49 and a step costing 1.335 AR steps give the paper's 4.86x.
    assert report.implied_speedup(6.49, 10.0, 1.5, 11.85) == pytest.approx(4.86, abs=0.005)
    assert report.implied_speedup(report.PAPER_TAU, 1.0, 0.1, 1.2) == pytest.approx(6.49 / 1.3)
    with pytest.raises(ValueError):
        report.implied_speedup(6.49, 1.0, 0.0, 0.0)


def test_attention_bytes_and_floor_match_the_plugin_readme():
    # Qwen3-8B drafter layer, one sequence, 32k cached rows, no new rows: the cache read dominates (134 MB), about
    # 28 us at H200's 4.8 TB/s.
    num_bytes = report.attention_bytes([32768], [0], 16, 32, 8, 128, 2)
    cache = 2 * 32768 * 8 * 128 * 2
    assert num_bytes == cache + 16 * (2 * 32 + 2 * 8) * 128 * 2
    assert report.floor_us(num_bytes, report.nominal_bandwidth("NVIDIA H200")) == pytest.approx(28.0, abs=0.5)
    assert report.attention_bytes([10, 20], [3, 0], 1, 1, 1, 64, 4) == 2 * 30 * 256 + 4 * 3 * 256 + 2 * 4 * 256
    assert report.nominal_bandwidth("Some GPU") is None


def test_table_aligns_columns_in_first_seen_order():
    table = report.format_table([{"batch": 1, "t_ms": 1.23456, "ok": True}, {"batch": 32, "extra": "x"}])
    lines = table.splitlines()
    assert lines[0].split() == ["batch", "t_ms", "ok", "extra"]
    assert lines[2].split() == ["1", "1.235", "yes"] and lines[3].split() == ["32", "x"]
    assert len({len(line.rstrip()) <= len(lines[1]) for line in lines}) == 1
    assert report.format_table([]) == ""


def test_json_report_and_exit_code(tmp_path):
    sections = [Section("a", rows=[{"x": 1.5}]), Section("b", "skipped", "no sanitizer")]
    assert report.exit_code(sections) == 0
    path = report.write_json(tmp_path / "d" / "gpu-check.json", sections, {"device": "X"})
    data = json.loads(path.read_text())
    assert data["ok"] is True and data["meta"] == {"device": "X"}
    assert [s["name"] for s in data["sections"]] == ["a", "b"] and data["sections"][0]["rows"] == [{"x": 1.5}]
    sections.append(Section("c", "fail", "mismatch"))
    assert report.exit_code(sections) == 1
    assert "== c: FAIL" in report.format_report(sections)
    with pytest.raises(ValueError):
        Section("d", "maybe")


def test_a_section_that_raises_is_recorded_not_fatal():
    def broken():
        raise RuntimeError("no kernel image\nsecond line")

    section = timed("broken", broken)
    assert section.status == "error" and section.message == "RuntimeError: no kernel image"


def test_sanitizer_runs_the_small_cases_and_fails_on_hazards():
    command = sanitizer_command("compute-sanitizer", "racecheck")
    assert command[:3] == ["compute-sanitizer", "--tool", "racecheck"]
    assert command[command.index("--error-exitcode") + 1] != "0"
    assert command[-2:] == ["-m", "dflash_trt.gpu_check.small_case"]


def test_targets_are_judged_from_the_timing_rows_and_never_fail_the_check():
    kernel = Section("kernel time vs SDPA vs HBM floor", rows=[
        {"batch": 1, "context": 8192, "kernel_us": 20.0, "sdpa_us": 30.0, "floor_us_copy_bw": 8.0,
         "pct_of_nominal_hbm": 40.0},
        {"batch": 1, "context": 32768, "kernel_us": 40.0, "sdpa_us": 35.0, "floor_us_copy_bw": 30.0,
         "pct_of_nominal_hbm": 70.0},
        {"batch": 8, "context": 8192, "kernel_us": 1.0, "sdpa_us": 2.0, "floor_us_copy_bw": 1.0}])
    steps = Section("step times (eager)", rows=[
        {"batch": 1, "verify_over_AR": 1.2, "implied_speedup": 4.0, "implied_speedup_graphed_draft": 4.7}])
    section = report.targets([kernel, steps])
    met = {r["target"]: r["met"] for r in section.rows}
    assert met == {"kernel >= 50% of HBM, batch 1, 8192 keys": False,
                   "kernel not slower than SDPA, batch 1, 8192 keys": True,
                   "kernel >= 50% of HBM, batch 1, 32768 keys": True,
                   "kernel not slower than SDPA, batch 1, 32768 keys": False,
                   "t_verify(16) / t_AR <= 1.3, batch 1": True,
                   "implied speedup >= 4.5x at tau 6.49, batch 1": True}
    assert section.status == "pass" and section.message == "4 of 6 met"
    assert report.exit_code([kernel, steps, section]) == 0
    assert report.targets([]).status == "skipped"


def test_the_graphed_verify_counts_for_the_batch_1_targets():
    steps = Section("step times (eager and graphed)", rows=[
        {"batch": 1, "verify_over_AR": 1.6, "implied_speedup": 4.0, "implied_speedup_graphed_draft": 4.2,
         "verify_over_AR_graphed": 1.25, "implied_speedup_graphed": 4.6}])
    values = {r["target"]: (r["value"], r["met"]) for r in report.targets([steps]).rows}
    assert values == {"t_verify(16) / t_AR <= 1.3, batch 1": (1.25, True),
                      "implied speedup >= 4.5x at tau 6.49, batch 1": (4.6, True)}
