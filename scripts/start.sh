#!/usr/bin/env bash
# Set up (scripts/setup.sh), start the reference server on vLLM (or SGLang) with the bundled
# model, and open the course in marimo. Ctrl-C stops both.
#
#   WORKSHOP_ENGINE=vllm|sglang|mini|hf            the engine (sglang: set up in .venv-sglang;
#                                                   mini, the teaching engine, runs on any CPU)
#   WORKSHOP_MODEL=smollm2-135m|<folder>|<hf id>   the model (default: bundled SmolLM2)
#   WORKSHOP_PORT=8000  WORKSHOP_UI=marimo|none     server port; `none` serves only the API
set -euo pipefail
cd "$(dirname "$0")/.."
engine=${WORKSHOP_ENGINE:-vllm}
case "$engine" in
  vllm|mini|hf) bash scripts/setup.sh;;
  sglang) bash scripts/setup.sh --with-sglang;;
  *) echo "WORKSHOP_ENGINE must be vllm, sglang, mini or hf, not '$engine'" >&2; exit 2;;
esac
# shellcheck disable=SC1091
. "${WORKSHOP_VENV:-.venv}/bin/activate"

port=${WORKSHOP_PORT:-8000}
model=${WORKSHOP_MODEL:-smollm2-135m}
log=${WORKSHOP_CACHE:-$HOME/.cache/llm-workshop}/logs/server-$port.log
mkdir -p "$(dirname "$log")"
echo "==> starting the reference server ($engine, $model) on port $port; log: $log"
python -m reference_server --engine "$engine" --model "$model" --port "$port" >"$log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null' EXIT INT TERM
until curl -sf "http://127.0.0.1:$port/ready" >/dev/null; do
  if ! kill -0 $server 2>/dev/null; then echo "server failed to start:" >&2; tail -30 "$log" >&2; exit 1; fi
  sleep 2
done
echo "==> ready: OpenAI API at http://127.0.0.1:$port/v1 (model $(curl -s "http://127.0.0.1:$port/v1/models" | python -c 'import json,sys; print(json.load(sys.stdin)["data"][0]["id"])'))"
# The notebooks' first cell (workshop.session.connect) serves WORKSHOP_ENGINE and finds its
# server in that engine's variable: WORKSHOP_BASE_URL for vLLM, WORKSHOP_SGLANG_BASE_URL ...
export WORKSHOP_ENGINE="$engine"
if [ "$engine" = vllm ]; then
  export WORKSHOP_BASE_URL="http://127.0.0.1:$port"
else
  export "WORKSHOP_$(echo "$engine" | tr '[:lower:]' '[:upper:]')_BASE_URL=http://127.0.0.1:$port"
fi
if [ "${WORKSHOP_UI:-marimo}" = none ]; then
  echo "    try: curl http://127.0.0.1:$port/server_info   (Ctrl-C to stop)"
  wait $server
else
  echo "==> opening the course: point a browser at the URL marimo prints below"
  marimo edit --headless --host 127.0.0.1 --port "${WORKSHOP_UI_PORT:-2718}" notebooks/
fi
