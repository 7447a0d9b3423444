"""Launched processes exit 0 right after a collective, even when gloo's worker threads lag behind.

Without hasten's exit hook waiting for those threads, this launch aborted (signal 6, `terminate called without
an active exception`) in 3 of 3 runs; see docs/launch.md ("Exiting cleanly").
"""

from __future__ import annotations

import pytest

from launching import launch


def test_script_that_ends_right_after_a_collective_exits_cleanly():
    result = launch("exit_after_collective.py", flags=["--cpu"])
    assert "terminate called" not in result.stderr, result.stderr
    assert result.stdout.count("EXIT CHECK collectives done") == 2, result.stdout + result.stderr


# -- issue 30, item 10: gloo beside NCCL takes NCCL's interface ----------------------------------------------------
def test_gloo_takes_the_interface_given_to_nccl(monkeypatch):
    import socket

    from hasten.distributed.bootstrap import gloo_interface_from_nccl, gloo_interface_words

    monkeypatch.setattr(socket, "if_nameindex", lambda: [(1, "lo"), (2, "eth0"), (3, "eth1"), (4, "ib0")])
    env = {"NCCL_SOCKET_IFNAME": "eth"}  # NCCL's names are prefixes; gloo's are exact
    assert gloo_interface_from_nccl(env) == "eth0,eth1" and env["GLOO_SOCKET_IFNAME"] == "eth0,eth1"
    env = {"NCCL_SOCKET_IFNAME": "=eth1"}
    assert gloo_interface_from_nccl(env) == "eth1"
    env = {"NCCL_SOCKET_IFNAME": "ib0", "GLOO_SOCKET_IFNAME": "eth0"}  # the user's own choice stays
    assert gloo_interface_from_nccl(env) == "eth0"
    for nccl in ("^docker,lo", "wlan", ""):  # an exclusion list, or nothing that matches: gloo chooses as before
        env = {"NCCL_SOCKET_IFNAME": nccl}
        assert gloo_interface_from_nccl(env) is None and "GLOO_SOCKET_IFNAME" not in env
    assert gloo_interface_words({"GLOO_SOCKET_IFNAME": "eth0", "NCCL_SOCKET_IFNAME": "eth"}) == \
        "gloo uses network interface eth0 (GLOO_SOCKET_IFNAME=eth0 (from NCCL_SOCKET_IFNAME))"
    assert "from this machine's hostname" in gloo_interface_words({})


def test_a_control_group_that_cannot_connect_names_the_interface(monkeypatch):
    from hasten.core.errors import DistributedOperationException
    from hasten.distributed import bootstrap, control

    def refuse(timeout=None):
        raise RuntimeError("Gloo connectFullMesh failed")

    monkeypatch.setattr(control, "control_group", refuse)
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "eth7")
    monkeypatch.delenv("NCCL_SOCKET_IFNAME", raising=False)
    with pytest.raises(DistributedOperationException, match="could not connect: Gloo connectFullMesh failed; gloo "
                                                            "uses network interface eth7 .* Fix: set GLOO_SOCKET_IFNAME"):
        bootstrap._make_control_group(None)
