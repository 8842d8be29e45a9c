"""A features host inside the training container (lab tier: real sshd, the lab's pct
TEST STAND-IN on the trainer): every command, upload, download and bulk read of that host
runs inside the container, as staging enters it."""

from __future__ import annotations

import subprocess

import pytest

from dflash_ops.core.inventory import FeaturesHost, Inventory
from dflash_ops.remote.connection import Host


def _features_in_the_container(inventory: Inventory) -> Inventory:
    """The inventory plus host `gpu`: the trainer's own address and login, entering the
    trainer's container."""
    trainer = inventory.trainer
    gpu = FeaturesHost.model_validate(
        {
            **trainer.model_dump(include={"address", "user", "port", "identity_file"}),
            "known_hosts": trainer.known_hosts,
            "role": "features",
            "container": trainer.container.model_dump(),
            "workdir": "/workspace/features",
            "venv": {"path": "/workspace/features-venv", "torch": "cuda"},
            "target_model": "/workspace/target",
        }
    )
    return inventory.model_copy(update={"hosts": {**inventory.hosts, "gpu": gpu}})


def test_a_features_host_in_a_container_works_inside_it(lab, inventory):
    if inventory.trainer.container is None or inventory.trainer.container.kind != "pct":
        pytest.skip("the lab reaches its container through pct only as root")
    host = Host(_features_in_the_container(inventory), "gpu")
    written, uploaded = "/workspace/gpus-written", "/workspace/gpus-uploaded"
    try:
        host.run(f"echo made inside > {written}")
        assert lab.container_path(written).read_text() == "made inside\n"
        host.upload(b"some bytes\n", uploaded, private=True)
        assert lab.container_path(uploaded).read_bytes() == b"some bytes\n"
        assert lab.container_path(uploaded).stat().st_mode & 0o777 == 0o600
        assert host.download(uploaded) == b"some bytes\n"
        assert host.download("/workspace/gpus-never-made") is None
        streamed = subprocess.run(
            host.ssh_argv(f"cat {uploaded}"), capture_output=True, timeout=30, check=False
        )
        assert streamed.stdout == b"some bytes\n", streamed.stderr
        # Inside, / is the container's rootfs: the lab's files on the host are not there.
        seen = host.run(f"test -e {lab.root} && echo host || echo container").stdout
        assert seen.strip() == "container"
    finally:
        host.close()
        for path in (written, uploaded):
            lab.container_path(path).unlink(missing_ok=True)
