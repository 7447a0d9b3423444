"""`hasten.commands.estimate`'s Accelerate helper functions (the `hasten estimate-memory` command itself is
tested in test_config.py and test_cli_errors.py)."""

import pytest
import torch

from hasten.commands import estimate
from hasten.core.errors import HubAccessError


@pytest.fixture
def factory(tmp_path, monkeypatch):
    (tmp_path / "estimate_tiny_factory.py").write_text(
        "import torch\n"
        "def build():\n"
        "    return torch.nn.Sequential(torch.nn.Embedding(100, 8), torch.nn.Linear(8, 8), torch.nn.Linear(8, 4))\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "estimate_tiny_factory:build"


def test_parser_takes_accelerates_arguments():
    args = estimate.estimate_command_parser().parse_args(["some/model", "--dtypes", "float32", "int4",
                                                          "--library_name", "timm", "--trust_remote_code"])
    assert (args.model_name, args.dtypes, args.library_name, args.trust_remote_code) == (
        "some/model", ["float32", "int4"], "timm", True)


def test_gather_data_rows_follow_accelerates_arithmetic(factory):
    args = estimate.estimate_command_parser().parse_args([factory, "--dtypes", "float32", "float16", "int8", "int4"])
    total = (100 * 8 + 8 * 8 + 8 + 8 * 4 + 4) * 4
    largest = 100 * 8 * 4
    rows = estimate.gather_data(args)
    assert [row[0] for row in rows] == ["float32", "float16", "int8", "int4"]
    assert [(row[1], row[2]) for row in rows] == [(largest / d, total / d) for d in (1, 2, 4, 8)]
    assert max(rows[0][3].values()) == 4 * total  # fp32 Adam: weights, gradients, two states
    assert max(rows[1][3].values()) == 4 * total / 2  # mixed precision peaks at the two float32 Adam states
    assert set(rows[3][3].values()) == {-1}  # no training estimate for int4


def test_estimate_training_usage():
    assert estimate.estimate_training_usage(1000, "float32") == {
        "model": 1000, "optimizer": 2000, "gradients": 1000, "step": 4000}
    assert estimate.estimate_training_usage(1000, "bfloat16") == {
        "model": 1000, "optimizer": 2000, "gradients": 1500, "step": 2000}
    assert estimate.estimate_training_usage(1000, "fp8") == estimate.estimate_training_usage(1000, "float16")
    assert set(estimate.estimate_training_usage(1000, "fp8", msamp_config="O2").values()) == {-1}


def test_hub_names_are_refused_as_an_os_error_in_one_line():
    with pytest.raises(OSError, match="does not download from the Hub") as raised:
        estimate.create_empty_model("somebrokenname", library_name=None)
    assert isinstance(raised.value, HubAccessError) and isinstance(raised.value, ValueError)
    with pytest.raises(HubAccessError, match="never contacts"):
        estimate.create_empty_model(".", library_name=None, access_token="hf_x")
    with pytest.raises(HubAccessError, match="does not contact the Hugging Face Hub"):
        estimate.verify_on_hub("meta-llama/Llama-2-7b-hf")
    with pytest.raises(HubAccessError, match="timm model on the Hub"):
        estimate.create_empty_model("timm/resnet50.a1_in1k", library_name="timm")
    with pytest.raises(ValueError, match="Library `keras` is not supported"):
        estimate.create_empty_model(".", library_name="keras")


def test_timm_architectures_are_built_without_the_hub():
    pytest.importorskip("timm")
    model = estimate.create_empty_model("resnet18", library_name="timm")
    assert isinstance(model, torch.nn.Module) and next(model.parameters()).device.type == "meta"


def test_add_timm_hub_prefix():
    assert estimate.add_timm_hub_prefix("resnet50") == "resnet50"
    assert estimate.add_timm_hub_prefix("resnet50.a1_in1k") == "resnet50.a1_in1k"
    assert estimate.add_timm_hub_prefix("timm/resnet50.a1_in1k") == "hf-hub:timm/resnet50.a1_in1k"
    assert estimate.add_timm_hub_prefix("hf-hub:timm/resnet50") == "hf-hub:timm/resnet50"
    assert estimate.add_timm_hub_prefix("local-dir:/path/to/model") == "local-dir:/path/to/model"


def test_check_has_model_names_the_library():
    pytest.importorskip("transformers")
    assert estimate.check_has_model(OSError("x does not appear to have a file named config.json")) == "transformers"
    assert estimate.check_has_model(ValueError("Unrecognized model in ./m")) == "transformers"
    assert estimate.check_has_model(TypeError("anything")) == "unknown"


def test_create_ascii_table_boxes_every_row():
    table = estimate.create_ascii_table(["dtype", "Total Size"], [["float32", "1.0 MB"], ["int4", "128 KB"]],
                                        "Memory Usage for loading `m`")
    lines = table.splitlines()
    assert len(lines) == 8 and len({len(line) for line in lines}) == 1
    assert lines[0].startswith("┌") and lines[-1].startswith("└") and "Memory Usage for loading `m`" in lines[1]
    assert "float32" in lines[5] and "128 KB" in lines[6]
