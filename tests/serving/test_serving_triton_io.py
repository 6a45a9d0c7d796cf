"""Load-time checks of the model configs and the parameter parsing the model.py files share."""

from __future__ import annotations

import pytest

from dflash_trt.serving import dflash_service
from dflash_trt.serving.triton_io import check_tensors, int_parameter, model_parameters, require_decoupled


def config(decoupled=True, inputs=None, outputs=None):
    inputs = dflash_service.INPUTS if inputs is None else inputs
    outputs = dflash_service.OUTPUTS if outputs is None else outputs
    return {
        "model_transaction_policy": {"decoupled": decoupled},
        "input": [{"name": n, "data_type": t} for n, t in inputs.items()],
        "output": [{"name": n, "data_type": t} for n, t in outputs.items()],
        "parameters": {"max_tokens_limit": {"string_value": "64"}, "num_threads": {"string_value": ""}},
    }


def test_rejects_a_non_decoupled_config_for_the_streaming_model():
    with pytest.raises(ValueError, match="model 'dflash' streams its answers: set model_transaction_policy"):
        require_decoupled(config(decoupled=False), "dflash")


def test_accepts_the_templates_tensors():
    check_tensors(config(), "dflash", dflash_service.INPUTS, dflash_service.OUTPUTS)


def test_rejects_a_tensor_of_the_wrong_type():
    inputs = {**dflash_service.INPUTS, "max_tokens": "TYPE_FP32"}
    with pytest.raises(ValueError, match="input 'max_tokens' is TYPE_FP32, expected TYPE_INT32"):
        check_tensors(config(inputs=inputs), "dflash", dflash_service.INPUTS, dflash_service.OUTPUTS)


def test_rejects_missing_and_unknown_tensors():
    outputs = {k: v for k, v in dflash_service.OUTPUTS.items() if k != "finish_reason"}
    with pytest.raises(ValueError, match="config lacks output"):
        check_tensors(config(outputs=outputs), "dflash", dflash_service.INPUTS, dflash_service.OUTPUTS)
    with pytest.raises(ValueError, match="unknown input 'extra'"):
        check_tensors(config(inputs={**dflash_service.INPUTS, "extra": "TYPE_INT32"}), "dflash",
                      dflash_service.INPUTS, dflash_service.OUTPUTS)


def test_integer_parameters_have_explicit_defaults_and_clear_errors():
    params = model_parameters(config())
    assert int_parameter(params, "max_tokens_limit", 4096, "dflash") == 64
    assert int_parameter(params, "num_threads", 0, "dflash") == 0
    assert int_parameter(params, "absent", 7, "dflash") == 7
    with pytest.raises(ValueError, match="parameter max_tokens_limit='many' is not an integer"):
        int_parameter({"max_tokens_limit": "many"}, "max_tokens_limit", 1, "dflash")
