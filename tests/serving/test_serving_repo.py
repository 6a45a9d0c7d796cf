"""`dflash-trt repo`: the rendered repository parses, follows the tensor contract, and carries its parameters."""

from __future__ import annotations

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from dflash_trt.errors import DFlashError
from dflash_trt.serving.repo import ENSEMBLES, MODELS, RepoConfig, pbtxt_string, render_repository
from dflash_trt.serving.requests import OUTPUTS, TEXT_INPUTS
from dflash_trt.serving.trtllm_inputs import TRTLLM_STEP_INPUTS

TYPE = model_config_pb2.DataType.Name


def load_config(path):
    return text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())


@pytest.fixture(scope="module")
def repo(tiny_engine, tmp_path_factory):
    out = tmp_path_factory.mktemp("repo")
    template = tmp_path_factory.mktemp("tpl") / "chat.jinja"
    template.write_text('Q: "{{ messages[0][\'content\'] }}"\\n\nA:')
    render_repository(RepoConfig(tiny_engine, out, chat_template=str(template), dflash_instances=3,
                                 max_queue_size=5, queue_timeout_us=2_000_000, max_tokens_limit=100))
    return out, {name: load_config(out / name / "config.pbtxt") for name in RENDERED}, template


RENDERED = [*MODELS[:-1], *ENSEMBLES]
# TensorRT-LLM's triton_backend/all_models/inflight_batcher_llm/ensemble/config.pbtxt: every tensor the two
# ensembles share has dims [1] there, except these (and its max_batch_size is > 0).
TRTLLM_DIMS = {"stop_words": [-1], "bad_words": [-1], "embedding_bias_words": [-1], "embedding_bias_weights": [-1],
               "text_output": [-1]}


def test_renders_the_models_with_their_code(repo):
    out, configs, _ = repo
    assert sorted(p.name for p in out.iterdir()) == sorted(RENDERED)
    for name in ("preprocessing", "dflash", "postprocessing", "tensorrt_llm"):
        assert (out / name / "1" / "model.py").is_file()
    for name in ENSEMBLES:
        assert (out / name / "1").is_dir()


def test_the_ensemble_has_tensorrt_llms_batch_dimension_and_dims_and_the_unbatched_one_todays(repo):
    configs = repo[1]
    batched, unbatched = configs["ensemble"], configs["ensemble_unbatched"]
    assert (batched.name, batched.max_batch_size) == ("ensemble", 1)
    for tensor in [*batched.input, *batched.output]:
        assert list(tensor.dims) == TRTLLM_DIMS.get(tensor.name, [1]), tensor.name
    assert (unbatched.name, unbatched.max_batch_size) == ("ensemble_unbatched", 0)
    dims = {t.name: list(t.dims) for t in [*unbatched.input, *unbatched.output]}
    assert dims == {**{name: [1] for name in dims}, **{k: v for k, v in TRTLLM_DIMS.items() if k != "text_output"}}
    assert unbatched.ensemble_scheduling == batched.ensemble_scheduling


@pytest.mark.parametrize("name", ENSEMBLES)
def test_the_ensemble_exposes_exactly_the_tensorrt_llm_contract(repo, name):
    ensemble = repo[1][name]
    # Every input is declared optional, text_input and max_tokens too: preprocessing names a missing one, where
    # Triton 2.51 would answer 200 with nothing when another optional input is sent.
    inputs = {t.name: (TYPE(t.data_type), t.optional) for t in ensemble.input}
    assert inputs == {name: (spec[1], True) for name, spec in TEXT_INPUTS.items()}
    assert {t.name: TYPE(t.data_type) for t in ensemble.output} == OUTPUTS


def test_every_ensemble_step_maps_tensors_its_model_declares(repo):
    configs = repo[1]
    available = {t.name for t in configs["ensemble"].input}
    for step in configs["ensemble"].ensemble_scheduling.step:
        model = configs[step.model_name]
        declared = {t.name for t in model.input} - set(TRTLLM_STEP_INPUTS)  # refused when called directly
        assert set(step.input_map) == declared, step.model_name
        assert set(step.input_map.values()) <= available, step.model_name
        assert set(step.output_map) <= {t.name for t in model.output}, step.model_name
        available |= set(step.output_map.values())
    assert {t.name for t in configs["ensemble"].output} <= available


def test_parameters_come_from_the_options_and_the_engine(repo, tiny_engine):
    configs, template = repo[1], repo[2]
    dflash = configs["dflash"]
    params = {k: v.string_value for k, v in dflash.parameters.items()}
    assert params["engine_dir"] == str(tiny_engine.resolve())
    assert params["max_tokens_limit"] == "100"
    assert int(params["max_context_tokens"]) == 2048 - 8  # preset max_seq_len, minus one draft block
    assert dflash.instance_group[0].count == 3 and dflash.model_transaction_policy.decoupled
    policy = dflash.dynamic_batching.default_queue_policy
    assert (policy.max_queue_size, policy.default_timeout_microseconds) == (5, 2_000_000)
    chat = configs["preprocessing"].parameters["chat_template"].string_value
    assert chat == template.read_text()  # quotes, backslashes and newlines survive the escaping


def test_both_text_entries_refuse_prompts_by_the_same_byte_limit(tiny_engine, tmp_path):
    from dflash_trt.serving.triton_io import request_limits

    out = render_repository(RepoConfig(tiny_engine, tmp_path, max_prompt_bytes=1234))
    for model in ("preprocessing", "tensorrt_llm"):
        params = {k: v.string_value for k, v in load_config(out / model / "config.pbtxt").parameters.items()}
        assert request_limits(params, model).prompt_bytes_limit == 1234, model


def test_rejects_a_chat_template_that_is_neither_a_keyword_nor_a_file(tiny_engine, tmp_path):
    with pytest.raises(DFlashError, match="expected 'auto', 'none', 'model' or a Jinja file"):
        render_repository(RepoConfig(tiny_engine, tmp_path, chat_template="chatml"))


def test_rejects_a_max_tokens_limit_beyond_the_context(tiny_engine, tmp_path):
    with pytest.raises(DFlashError, match="max_tokens_limit 5000 must be in"):
        render_repository(RepoConfig(tiny_engine, tmp_path, max_tokens_limit=5000))


def test_rejects_zero_instances(tiny_engine, tmp_path):
    with pytest.raises(DFlashError, match="dflash_instances must be >= 1"):
        render_repository(RepoConfig(tiny_engine, tmp_path, dflash_instances=0))


def test_a_missing_engine_is_a_clear_error(tmp_path):
    with pytest.raises(DFlashError, match="no manifest.json"):
        render_repository(RepoConfig(tmp_path / "nope", tmp_path / "out"))


def test_pbtxt_strings_escape_quotes_and_newlines():
    assert pbtxt_string('a "b"\n\\c') == 'a \\"b\\"\\n\\\\c'


def test_in_flight_batching_limits_have_defaults_and_options(repo, tiny_engine, tmp_path):
    params = {k: v.string_value for k, v in repo[1]["dflash"].parameters.items()}
    assert (params["block_policy"], params["max_batch_sequences"], params["prefill_chunk_tokens"]) == (
        "adaptive", "16", "512")
    assert int(params["max_kv_tokens"]) >= int(params["max_context_tokens"])
    render_repository(RepoConfig(tiny_engine, tmp_path, block_policy="fixed", max_batch_sequences=4,
                                 max_kv_tokens=9000, prefill_chunk_tokens=64))
    params = {k: v.string_value for k, v in load_config(tmp_path / "dflash" / "config.pbtxt").parameters.items()}
    assert (params["block_policy"], params["max_batch_sequences"], params["max_kv_tokens"],
            params["prefill_chunk_tokens"]) == ("fixed", "4", "9000", "64")


@pytest.mark.parametrize("bad, message", [(dict(block_policy="fast"), "block_policy must be one of"),
                                          (dict(max_batch_sequences=0), "max_batch_sequences must be >= 1"),
                                          (dict(max_kv_tokens=100), "must hold one full context")])
def test_bad_batching_limits_are_refused(tiny_engine, tmp_path, bad, message):
    with pytest.raises(DFlashError, match=message):
        render_repository(RepoConfig(tiny_engine, tmp_path, **bad))


def test_default_threads_never_oversubscribe_the_cores():
    from dflash_trt.serving.cpus import default_num_threads, usable_cpus

    assert default_num_threads(1, cpus=2) == 2 and default_num_threads(2, cpus=2) == 1
    assert default_num_threads(3, cpus=2) == 1 and default_num_threads(2, cpus=16) == 8
    assert 1 <= default_num_threads(1) == usable_cpus()
