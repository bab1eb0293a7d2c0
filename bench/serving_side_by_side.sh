#!/usr/bin/env bash
# bench/serving_side_by_side.sh: ordo-server against llama.cpp's own llama-server, over HTTP, in
# one run (issue 18's benchmark).
#
#   bash bench/serving_side_by_side.sh PEER_DIR OUT.jsonl [MODEL.gguf]
#
# PEER_DIR is a writable copy of ../shared/peer whose work/llamacpp holds llama.cpp built by its
# build_llamacpp.sh (llama-server, CPU). MODEL defaults to PEER_DIR/work/medium-q4_k_m.gguf
# (`ORDO_SIDE_SET=quant bash bench/side_by_side.sh` makes it). Both servers serve the same GGUF
# with the same number of slots (ORDO_SERVE_SLOTS, default 16: ordo's scheduler.max_sequences,
# llama-server's -np with -c slots x per-slot context, 2 threads); ordo-server runs on Vulkan
# (lavapipe here). The same client, `ordo-load --protocol http`, sends streamed
# /v1/completions requests of random token-id prompts (ORDO_SERVE_PROMPT tokens, default 128,
# ORDO_SERVE_GEN generated, default 128, the same sampler options to both) from 1, 8 and 16
# concurrent streams, ORDO_SERVE_REQUESTS per stream (default 2), twice: all streams starting
# together (a burst), and their first requests spread over ORDO_SERVE_RAMP_S seconds (default
# 10). One JSON line per configuration in OUT.jsonl ("label": engine/burst|ramp); a table at
# the end. A benchmark, not a test: ~10 minutes on 2 cores; the numbers mean something only on
# an otherwise idle machine.
set -euo pipefail

if (($# < 2)); then
  sed -n '2,19p' "$0"
  exit 2
fi
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
peer="$(cd "$1" && pwd)"
out="$(realpath -m "$2")"
model="$(realpath -m "${3:-$peer/work/medium-q4_k_m.gguf}")"
build="${ORDO_BUILD_DIR:-$root/build}"
load="$build/bench/ordo_load/ordo-load"
server="$build/tools/server/ordo-server"
llama="$peer/work/llamacpp/build/bin/llama-server"
slots="${ORDO_SERVE_SLOTS:-16}"
prompt="${ORDO_SERVE_PROMPT:-128}"
gen="${ORDO_SERVE_GEN:-128}"
requests="${ORDO_SERVE_REQUESTS:-2}"
ramp="${ORDO_SERVE_RAMP_S:-10}"
streams="${ORDO_SERVE_STREAMS:-1,8,16}"
for f in "$load" "$server"; do
  [[ -x "$f" ]] || { echo "no $f: build first (bash tools/dev.sh build)" >&2; exit 1; }
done
[[ -x "$llama" ]] || { echo "no $llama: run the peer's build_llamacpp.sh work/llamacpp" >&2; exit 1; }
[[ -f "$model" ]] || { echo "no $model (ORDO_SIDE_SET=quant bash bench/side_by_side.sh makes it)" >&2; exit 1; }

export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-/tmp}"
work="$(mktemp -d)"
llama_pid=""
cleanup() {
  [[ -n "$llama_pid" ]] && kill "$llama_pid" 2>/dev/null && wait "$llama_pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
# Every run is bounded: a stuck engine leaves its lines out and the table shows a gap.
limit_s=1500
ctx_per_slot=$((prompt + gen + 16))
printf '[scheduler]\nmax_sequences = %d\n' "$slots" >"$work/ordo.toml"
common=(--protocol http --streams "$streams" --requests "$requests" --prompt-tokens "$prompt"
        --max-tokens "$gen" --temperature 1 --top-k 40 --top-p 0.95 --min-p 0.05 --seed 7
        --duration-max-s "$limit_s" --event-timeout-s 300)

free_port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

run_ordo() {  # $1 ramp seconds, $2 label
  echo "# ordo $2 $(date +%T)" >>"$out"
  timeout "$limit_s" "$load" "${common[@]}" --spawn-server "$server" --model "$model" \
    --config "$work/ordo.toml" --ramp-s "$1" --label "ordo/$2" >>"$out" 2>>"$out.log" ||
    echo "ordo-load against ordo-server ($2) failed: $out.log" >&2
}

run_llama() {  # $1 ramp seconds, $2 label
  echo "# llama-server $2 $(date +%T)" >>"$out"
  local port
  port="$(free_port)"
  "$llama" -m "$model" -np "$slots" -c $((slots * ctx_per_slot)) -t 2 --host 127.0.0.1 \
    --port "$port" --log-disable >>"$out.log" 2>&1 &
  llama_pid=$!
  # ordo-load takes a refused connection as an unreachable server: wait until it listens.
  for _ in $(seq 1200); do
    curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
    kill -0 "$llama_pid" 2>/dev/null || break
    sleep 0.1
  done
  timeout "$limit_s" "$load" "${common[@]}" --port "$port" --ramp-s "$1" --label "llama/$2" \
    --startup-timeout-s 120 >>"$out" 2>>"$out.log" ||
    echo "ordo-load against llama-server ($2) failed: $out.log" >&2
  kill "$llama_pid" 2>/dev/null && wait "$llama_pid" 2>/dev/null || true
  llama_pid=""
}

: >"$out"
: >"$out.log"
echo "# model $model slots $slots prompt $prompt gen $gen requests $requests" >>"$out"
run_ordo 0 burst
run_llama 0 burst
run_ordo "$ramp" ramp
run_llama "$ramp" ramp
echo "# end $(date +%T)" >>"$out"

/usr/bin/python3 - "$out" <<'EOF'
import json, sys
rows = {}
for line in open(sys.argv[1]):
    if line.startswith("#") or not line.strip():
        continue
    d = json.loads(line)
    engine, arrival = d["model"].split("/")
    rows[(arrival, d["streams"], engine)] = d
f = lambda v, p=1: "-" if v is None else f"{v:.{p}f}"
print("(ramp rows: tok/s over the whole run, the ramp included)\n")
print("| arrivals | streams | ordo tok/s | llama-server tok/s | ordo/llama | ordo TTFT p50 / p99 ms | llama TTFT p50 / p99 ms | ordo ITL p50 / p99 ms | errors |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---|")
for arrival in ("burst", "ramp"):
    one = rows.get((arrival, 1, "ordo"))
    for n in sorted({k[1] for k in rows if k[0] == arrival}):
        o, l = rows.get((arrival, n, "ordo")), rows.get((arrival, n, "llama"))
        ratio = f"{o['aggregate_tok_s'] / l['aggregate_tok_s']:.2f}x" if o and l else "-"
        ttft = lambda d: f"{f(d['ttft_ms_p50'], 0)} / {f(d['ttft_ms_p99'], 0)}" if d else "-"
        itl = f"{f(o['itl_ms_p50'], 0)} / {f(o['itl_ms_p99'], 0)}" if o else "-"
        errs = {**(o or {}).get("errors", {}), **{"llama:" + k: v for k, v in (l or {}).get("errors", {}).items()}}
        print(f"| {arrival} | {n} | {f(o and o['aggregate_tok_s'])} | {f(l and l['aggregate_tok_s'])} | {ratio} | {ttft(o)} | {ttft(l)} | {itl} | {errs or ''} |")
    big = rows.get((arrival, max((k[1] for k in rows if k[0] == arrival), default=0), "ordo"))
    if one and big and one["ttft_ms_p50"] and big["ttft_ms_p99"]:
        print(f"\n{arrival}: ordo TTFT p99 at {big['streams']} streams / single-stream TTFT p50 = "
              f"{big['ttft_ms_p99'] / one['ttft_ms_p50']:.2f}x (target < 2x)\n")
EOF
