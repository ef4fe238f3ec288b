#!/usr/bin/env sh
# The policy's vLLM launch, outside compose (compose's `policy` service uses the same flags and env).
#   MODEL=Qwen/Qwen2.5-1.5B-Instruct deploy/vllm/serve.sh [extra vllm flags...]
# Needs: vLLM installed, this repository's root on PYTHONPATH (for shared/vllm_worker_extension.py), and the
# trainer's weights directory visible here at the same path the trainer writes it. It listens on 127.0.0.1:
# HOST=0.0.0.0 lets other hosts reach it (a trainer elsewhere), dev-mode routes included: a trusted network only.
set -eu
: "${MODEL:?set MODEL to the policy model (HF id or folder); keep it equal to the recipe's [trainer] model}"
REPO_ROOT="$(cd "$(dirname "$0")/../.." && pwd)"

export PYTHONPATH="${REPO_ROOT}${PYTHONPATH:+:$PYTHONPATH}"
export VLLM_ALLOW_RUNTIME_LORA_UPDATING=True   # POST /v1/load_lora_adapter and /v1/unload_lora_adapter
export VLLM_SERVER_DEV_MODE=1                  # POST /collective_rpc, /pause, /resume, /reset_prefix_cache
# vLLM's --api-key, from the environment (not in `ps`): with the stack's control token set, /v1 (completions,
# LoRA loading) answers only requests that carry it, as our clients do. It does not cover the dev-mode routes
# above: they are why HOST defaults to this host only (docs/security.md).
if [ -n "${CODA_CONTROL_TOKEN:-}" ]; then export VLLM_API_KEY="$CODA_CONTROL_TOKEN"; fi

exec vllm serve "$MODEL" \
  --served-model-name "${SERVED_MODEL_NAME:-policy}" \
  --host "${HOST:-127.0.0.1}" --port "${PORT:-8002}" \
  --max-model-len "${MAX_MODEL_LEN:-8192}" \
  --gpu-memory-utilization "${GPU_MEMORY:-0.45}" \
  --enable-lora --max-loras "${MAX_LORAS:-4}" --max-lora-rank "${MAX_LORA_RANK:-64}" \
  --worker-extension-cls shared.vllm_worker_extension.WeightUpdateExtension \
  --logprobs-mode "${LOGPROBS_MODE:-processed_logprobs}" \
  "$@"
