#!/usr/bin/env bash
# make setup: system tools the lab needs (sudo for its non-root `become: sudo` login), then
# .venv with the project, its extras and CPU torch. Every step is skipped when already done,
# so a rerun resumes an interrupted setup; the last one writes the stamp make waits for, once
# `fab` runs.
set -euo pipefail
cd "$(dirname "$0")/.."
ready=.venv/.setup-complete
rm -f "$ready"

need_tools=(sshd:openssh-server ssh:openssh-client ssh-keygen:openssh-client ip:iproute2 sudo:sudo)
missing=()
for pair in "${need_tools[@]}"; do
  tool=${pair%%:*} pkg=${pair##*:}
  command -v "$tool" >/dev/null 2>&1 || [ -x "/usr/sbin/$tool" ] || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
  if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
    echo "setup: installing ${missing[*]} with apt-get"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
  else
    echo "setup: missing system packages: ${missing[*]}" >&2
    echo "       install them, e.g.: sudo apt-get install ${missing[*]}" >&2
    exit 1
  fi
fi

# Chromium renders the HTML report in one test (tests/unit/test_report.py); without it that test is
# skipped, saying why. Installed as root where apt-get works; never a reason to stop setup.
if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
    echo "setup: installing chromium (the report's browser test) with apt-get"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
        --no-install-recommends chromium; } \
      || echo "setup: chromium could not be installed; the report's browser test will be skipped" >&2
  else
    echo "setup: no chromium; the report's browser test will be skipped (apt-get install chromium)" >&2
  fi
fi

PYTHON=${PYTHON:-python3}
# A venv cut short (no working pip yet) is made again over itself; a whole one is kept.
.venv/bin/python -m pip --version >/dev/null 2>&1 || "$PYTHON" -m venv .venv
pip=(.venv/bin/python -m pip install -q)

# CPU torch first, so that the project's plain `torch` requirement is already met and pip never
# picks the multi-GB CUDA build. A torch wheel in pip's find-links (a local mirror) wins;
# otherwise the PyTorch CPU index is added as an *extra* index (PyPI stays the main one).
if ! .venv/bin/python -c 'import torch' 2>/dev/null; then
  local_wheel=$(for d in ${PIP_FIND_LINKS:-}; do ls "$d"/torch-*.whl 2>/dev/null; done | sort -V | tail -n 1)
  if [ -n "$local_wheel" ]; then
    version=$(basename "$local_wheel" | cut -d- -f2 | cut -d+ -f1)
    echo "setup: torch==$version from $local_wheel"
    "${pip[@]}" "torch==$version"
  else
    echo "setup: CPU torch from the PyTorch CPU index"
    "${pip[@]}" torch --extra-index-url https://download.pytorch.org/whl/cpu
  fi
fi
"${pip[@]}" -e '.[eval,dev]'
# pip's `fab` entry point must exist, be executable and load the project's tasks.
if ! [ -x .venv/bin/fab ] || ! .venv/bin/fab --list >/dev/null; then
  echo "setup: .venv/bin/fab does not run; rerun make setup, or make clean setup" >&2
  exit 1
fi
echo "setup: ready ($(.venv/bin/python -c 'import torch, fabric; print("torch", torch.__version__, "fabric", fabric.__version__)'))"
touch "$ready"
