"""Provision eval hosts: uv, the venv and its packages, the deployed harness.

harness     deploy remote/dflash_eval under its content hash; `current` switched atomically
packages    the venv's requirement strings and where uv takes them from
state       the host's provisioning state in one round trip, and whether the venv needs work
uv          a uv on the host: present, a pinned checksum-verified download, pip, or pushed
wheelhouse  the air-gapped route: wheels downloaded here, pushed, installed with no index
venv        the build steps: disk check, uv venv, uv pip install, verify, record
setup       the `setup-eval-host` flow over those, idempotent
"""
