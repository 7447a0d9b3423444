"""Accelerate's `hasten.utils.<module>` paths that stand for one module of hasten's are that module itself, so a
patch through the public path changes what runs, and objects pickle by the name of the module that defines them."""

from __future__ import annotations

import importlib
import pickle
from unittest import mock

import pytest

SAME_MODULE = {
    "hasten.utils.constants": "hasten.core.constants",
    "hasten.utils.imports": "hasten.core.availability",
    "hasten.utils.versions": "hasten.core.availability",
    "hasten.utils.random": "hasten.distributed.rng",
    "hasten.utils.memory": "hasten.training.memory",
    "hasten.utils.torch_xla": "hasten.launch.tpu",
    "hasten.utils.transformer_engine": "hasten.training.fp8.te",
    "hasten.utils.ao": "hasten.training.fp8.ao",
    "hasten.utils.offload": "hasten.big_model.offload",
    "hasten.utils.fsdp_utils": "hasten.backends.fsdp.functions",
}


@pytest.mark.parametrize("public, real", sorted(SAME_MODULE.items()))
def test_public_path_is_the_real_module(public, real):
    assert importlib.import_module(public) is importlib.import_module(real)


def test_a_patch_through_the_public_path_reaches_the_code_that_runs():
    import hasten.distributed.rng as rng
    from hasten import set_seed

    with mock.patch("hasten.utils.random.synchronize_rng_state") as patched:
        rng.synchronize_rng_states(["torch"])
    assert patched.call_count == 1  # synchronize_rng_states looks the function up in its own module
    set_seed(0)  # unpatched again afterwards


def test_objects_pickle_by_their_defining_module():
    from hasten import DistributedType, ProjectConfiguration

    config = ProjectConfiguration(project_dir="p", automatic_checkpoint_naming=True, total_limit=3)
    again = pickle.loads(pickle.dumps(config))
    assert again == config and type(again) is ProjectConfiguration
    assert pickle.loads(pickle.dumps(DistributedType.MULTI_GPU)) is DistributedType.MULTI_GPU
    assert DistributedType.__module__ == "hasten.core.enums"
