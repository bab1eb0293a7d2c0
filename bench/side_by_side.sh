#!/usr/bin/env bash
# bench/side_by_side.sh: ordo against llama.cpp on the same GGUF files, interleaved in one run.
#
#   bash bench/side_by_side.sh PEER_DIR OUT.jsonl [ORDO_BENCH_REPS]
#   ORDO_SIDE_SET=quant bash bench/side_by_side.sh PEER_DIR OUT.jsonl [ORDO_BENCH_REPS]
#
# PEER_DIR is a writable copy of ../shared/peer with its npm packages installed (its README,
# "Install from scratch"); the models are made there with its make_random_llama.py when missing.
# Model sets (ORDO_SIDE_SET): `sizes` (default; small F32 and medium F16, the issue 4 sizes) or
# `quant` (issue 16: the medium shape in F16, and Q8_0, Q4_K_M and Q6_K made from it by
# llama.cpp's own llama-quantize, which PEER_DIR/work/llamacpp must hold: the peer's
# build_llamacpp.sh builds it). Per model, one after the other: ordo-bench
# (this build, Vulkan), llama.cpp's CPU backend (2 threads), llama.cpp's Vulkan backend (the
# same lavapipe device; shorter decode runs, as the peer's run_all.sh does: it is ~20x slower).
# Every result is one JSON line in OUT.jsonl, with "# model engine time" marker lines; at the
# end a table of tokens/s and ratios is printed. A benchmark, not a test: ~6 minutes on 2 cores,
# and the numbers mean something only on an otherwise idle machine.
set -euo pipefail

if (($# < 2)); then
  sed -n '2,13p' "$0"
  exit 2
fi
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
peer="$(cd "$1" && pwd)"
out="$(realpath -m "$2")"
reps="${3:-2}"
bench="${ORDO_BUILD_DIR:-$root/build}/bench/ordo_bench/ordo-bench"
[[ -x "$bench" ]] || { echo "no $bench: build first (bash tools/dev.sh build)" >&2; exit 1; }
[[ -d "$peer/node_modules/node-llama-cpp" ]] || {
  echo "$peer has no node_modules/node-llama-cpp: install the peer first (its README)" >&2; exit 1; }

export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-/tmp}" NODE_LLAMA_CPP_SKIP_DOWNLOAD=true
export GGML_VK_VISIBLE_DEVICES="${GGML_VK_VISIBLE_DEVICES:-0}"  # lavapipe must be named
# Each engine's run is bounded; a stuck run leaves its line out and the table shows a gap.
limit_s=900

cd "$peer"
mkdir -p work
[[ -f work/small-f32.gguf ]] || python3 make_random_llama.py --out work/small-f32.gguf \
  --n-embd 288 --n-layer 6 --n-head 6 --n-ff 768 --n-vocab 32000 --ctx 2048 --dtype f32 \
  --tie-embeddings --name small-f32 >/dev/null
[[ -f work/medium-f16.gguf ]] || python3 make_random_llama.py --out work/medium-f16.gguf \
  --n-embd 768 --n-layer 12 --n-head 12 --n-ff 2048 --n-vocab 32000 --ctx 2048 --dtype f16 \
  --tie-embeddings --name medium-f16 >/dev/null

case "${ORDO_SIDE_SET:-sizes}" in
sizes) models=(small-f32 medium-f16) ;;
quant)
  quantize="$peer/work/llamacpp/build/bin/llama-quantize"
  [[ -x "$quantize" ]] || {
    echo "no $quantize: run the peer's build_llamacpp.sh work/llamacpp first" >&2; exit 1; }
  models=(medium-f16)
  for q in Q8_0 Q4_K_M Q6_K; do
    m="medium-${q,,}"
    [[ -f "work/$m.gguf" ]] || "$quantize" work/medium-f16.gguf "work/$m.gguf" "$q" 2 \
      >"work/$m.quantize.log" 2>&1 || { echo "llama-quantize $q failed (work/$m.quantize.log)" >&2; exit 1; }
    models+=("$m")
  done ;;
*) echo "ORDO_SIDE_SET must be sizes or quant" >&2; exit 2 ;;
esac

: >"$out"
for m in "${models[@]}"; do
  echo "# $m ordo $(date +%T)" >>"$out"
  timeout "$limit_s" "$bench" --model "work/$m.gguf" --label "$m" --prompts 128,512 \
    --parallel 4 --reps "$reps" --json >>"$out" 2>>"$out.log" || echo "ordo-bench failed" >&2
  echo "# $m cpu $(date +%T)" >>"$out"
  timeout "$limit_s" node bench_llamacpp.mjs --model "work/$m.gguf" --label "$m" --backend cpu \
    --threads 2 --reps "$reps" >>"$out" 2>>"$out.log" || echo "llama.cpp cpu failed" >&2
  echo "# $m vulkan $(date +%T)" >>"$out"
  if [[ $m == small-* ]]; then short=(--gen 32 --par-gen 8); else short=(--gen 16 --par-gen 4); fi
  timeout "$limit_s" node bench_llamacpp.mjs --model "work/$m.gguf" --label "$m" \
    --backend vulkan --reps 1 "${short[@]}" >>"$out" 2>>"$out.log" || echo "llama.cpp vulkan failed" >&2
done
echo "# end $(date +%T)" >>"$out"

python3 - "$out" <<'EOF'
import json, sys
rows, order = {}, []
for line in open(sys.argv[1]):
    if line.startswith("#") or not line.strip():
        continue
    d = json.loads(line)
    if d["test"].startswith("kernels"):
        continue
    engine = "ordo" if d.get("engine") == "ordo" else d["backend"]
    t = d["test"]
    kind = t if t.startswith("pp") else ("tg x" if "x" in t else "tg")
    key = (d["model"], kind)
    if key not in rows:
        order.append(key)
    rows.setdefault(key, {})[engine] = (d.get("prefill_tok_s") or d.get("decode_tok_s"), t)
print("| model | test | ordo | llama.cpp CPU | llama.cpp Vulkan | vs CPU | vs Vulkan |")
print("|---|---|---:|---:|---:|---:|---:|")
for key in order:
    r = rows[key]
    o, c, v = (r.get(e, (None, "-")) for e in ("ordo", "cpu", "vulkan"))
    ratio = lambda a, b: f"{a[0] / b[0]:.2f}x" if a[0] and b[0] else "-"
    show = lambda x: f"{x[0]:.1f} ({x[1]})" if x[0] else "-"
    print(f"| {key[0]} | {o[1]} | {show(o)} | {show(c)} | {show(v)} | {ratio(o, c)} | {ratio(o, v)} |")
# ordo's own decode rate per model against its F16 run (issue 16: Q4_K_M >= 1.3x F16).
base = rows.get(("medium-f16", "tg"), {}).get("ordo", (None,))[0]
if base:
    print()
    print("| model | ordo tg tok/s | vs ordo medium-f16 |")
    print("|---|---:|---:|")
    for (model, kind), r in rows.items():
        if kind == "tg" and r.get("ordo", (None,))[0]:
            print(f"| {model} | {r['ordo'][0]:.1f} | {r['ordo'][0] / base:.2f}x |")
EOF
