#!/usr/bin/env bash
# The vLLM plugin of a generated wheel, checked against the real vLLM on a CPU machine
# (vLLM cannot be installed on the GPU machine: no package index there, and it wants
# its own torch). Makes the environment once (VLLM_ENV, default /work/vllm-env: vLLM
# 0.32.0 with the PyPI torch it pins; a pip find-links folder that offers a CPU-only
# torch must be bypassed, or torchvision's CUDA build fails to import), installs the
# wheel and cudal2-free runtime deps into it (any other cudal2 wheel there removed
# first: vLLM would load its plugin too), and runs ci/vllm_check.py.
#
#   bash ci/vllm_check.sh WHEEL
#
# The wheel whose output docs/inference.md quotes (bench/results/vllm-plugin-check.txt):
# Llama-3.1-8B's layer with PDL entries, replayed from its recorded H100 database:
#   cudal2-build bench/manifests/layer-epilogues-h100.toml --out /tmp/wl --jobs 2
#   bash ci/vllm_check.sh /tmp/wl/cudal2_kernels_layer_epilogues_h100-0.1.0-*.whl
set -euo pipefail
WHEEL=$1
ENV=${VLLM_ENV:-/work/vllm-env}
PIP=(env PIP_FIND_LINKS= PIP_CONFIG_FILE=/dev/null "$ENV/bin/pip" install -q)
if [ ! -x "$ENV/bin/python" ]; then
  python3 -m venv "$ENV"
  "${PIP[@]}" "vllm==0.32.0"
fi
OLD=$("$ENV/bin/pip" list --format=freeze 2>/dev/null | sed -n 's/^\(cudal2[-_]kernels[-_][^=]*\)==.*/\1/Ip')
[ -z "$OLD" ] || "$ENV/bin/pip" uninstall -q -y $OLD
"${PIP[@]}" --force-reinstall --no-deps "$WHEEL"
"${PIP[@]}" cuda-bindings  # the runtime's driver calls (imported at first use only)
PKG=$(python3 -c "import sys, zipfile; print(next(n.split('/')[0] for n in zipfile.ZipFile(sys.argv[1]).namelist() if n.endswith('/__init__.py')))" "$WHEEL")
cd "$(dirname "$0")"  # not the repository root: import the installed wheel only
"$ENV/bin/python" vllm_check.py --package "$PKG"
