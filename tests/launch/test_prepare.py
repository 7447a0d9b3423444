"""hasten.launch.prepare's SageMaker helper: a script's `--name value` arguments as typed hyperparameters."""

from __future__ import annotations

import pytest

from hasten.utils.launch import _convert_nargs_to_dict


def test_script_arguments_become_typed_hyperparameters():
    converted = _convert_nargs_to_dict(["--model-name", "bert", "--do_train", "False", "--epochs", "3",
                                        "--lr", "5e-5", "--max_steps", "50.5", "--shift", "-2", "--whole", "4.0"])
    assert converted == {"model_name": "bert", "do_train": False, "epochs": 3, "lr": 5e-5, "max_steps": 50.5,
                         "shift": -2, "whole": 4}
    assert type(converted["epochs"]) is int and type(converted["whole"]) is int
    assert _convert_nargs_to_dict([]) == {}


@pytest.mark.parametrize("nargs", [["--do_train", "--epochs", "3"], ["--epochs", "3", "--do_predict"]])
def test_a_switch_without_a_value_is_refused_with_accelerates_words(nargs):
    with pytest.raises(ValueError, match="SageMaker doesn’t support argparse actions for `store_true`"):
        _convert_nargs_to_dict(nargs)


def test_a_value_without_a_name_is_refused():
    with pytest.raises(ValueError, match="'stray' follows no --name"):
        _convert_nargs_to_dict(["stray", "--epochs", "3"])
