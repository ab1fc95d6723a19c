"""The launcher's options (leantrain.launch.torchrun): a bad port or host stops the command before any worker
starts, with a message naming the option and its value."""

from __future__ import annotations

import pytest

from leantrain.errors import UserError
from leantrain.launch.torchrun import LaunchOptions


@pytest.mark.parametrize("opts, message", [
    (dict(master_port=70000), "--master-port 70000: a TCP port is 1..65535"),
    (dict(master_port=0), "--master-port 0"),
    (dict(master_addr="not a host"), "--master-addr 'not a host': not an IP address or a host name"),
    (dict(master_addr="300.1.2.3"), "not an IP address"),
    (dict(master_addr="no-such-host.invalid"), "no such host"),
])
def test_launcher_options_are_checked(opts, message):
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(".", r"\.")):
        LaunchOptions(nproc=2, **opts).check()
    LaunchOptions(nproc=2, master_addr="127.0.0.1", master_port=29500).check()
    LaunchOptions(nproc=2, master_addr="localhost").check()
