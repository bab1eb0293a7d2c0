#!/usr/bin/env bash
# gpu_next.sh: the A/Bs gpu/PERF.md's "next GPU call" asks for, run in the same device call right
# after ../shared/gpu's kit (`bash .gpu/run.sh; bash bench/gpu_next.sh`), on the files and
# binaries the kit unpacked. Not a test: it prints numbers. Results go under $OUT (at most a few
# files, since only 8 come back from a device call):
#   next.jsonl   first the cooperative-matrix mat-mul (session 28, gpu.batch_invariant = false:
#                never run on a GPU before): ordo-bench-kernels' tiled lines with --coop 1 (each
#                line's coop_err is its largest difference from the invariant kernel over the
#                token's RMS: about 1e-3 expected, about 1 means a wrong kernel) for its default
#                tiles and four others, then ordo-bench --batch-invariant off (its warm-up
#                choices, the large tile's among them, also go to next.log); then batch-1
#                decode with each weight's measured mul_mat_vec shape and without (--mmv-shapes),
#                batch-1 and 16-sequence decode with RoPE and the KV store folded into the q|k|v
#                mat-vec and without (--qkv-rope),
#                prefill and 16 / 64 sequences with the measured tiled layouts and without;
#                decode attention's lines and batch-1 / 64-sequence decode at attention.comp's
#                load groups (--attn-k-pairs, --attn-v-group);
#                then ordo-bench-kernels' tiled lines for each layout of the tiled mat-mul (one 1B
#                layer's mat-muls at 16..512 tokens; session 27: swizzled tiles, token tiles
#                first, narrow tiles, a K step of 64, staging by rows, and session 26's
#                layout), ordo-bench
#                with --replay off
#                (the kit's own ordo step ran with replay on) and ordo-load lines, each labelled;
#                last, greedy ordo-load lines at scheduler.decode_steps 1, 4 and 8
#   next.log     the servers' device-choice lines, /metrics' gpu counters after each load, the
#                mul_mat_vec shapes' and the tiled layouts' warm-up times
# Environment (all optional): W (the kit's work dir, /tmp/gpu-work), MODEL (l1b-q4k), PP, TG,
# PAR, STREAMS (as the kit's), BATCH_TOKENS (the second server's max_batch_tokens, 2048),
# TESTS (the GPU test binaries bench/gpu_tests.sh packed: .gpu/tests.tar.xz; run first when
# there, into tests.log, within TESTS_S seconds, 120), PARTS (which of tests coop mmv rope attn
# layouts tiled replay serve steps to run, in that order; all by default), STEP_STREAMS (the
# steps part's streams: greedy 1,8, sampled 1,8,64,128).
# Dry run on lavapipe: W=<dir with ordo/bin and MODEL.gguf> MODEL=... PP=16 TG=8 PAR=2
# STREAMS=1,2 bash bench/gpu_next.sh
set -uo pipefail
out=${OUT:-/tmp/gpu-out}; mkdir -p "$out"
w=${W:-/tmp/gpu-work}
: "${MODEL:=l1b-q4k}" "${PP:=512}" "${TG:=64}" "${PAR:=1,16,64}" "${STREAMS:=1,64}"
: "${BATCH_TOKENS:=2048}"
# The parts to run, in this order (a device call's minutes may not hold them all after the kit).
: "${PARTS:=tests coop mmv rope attn layouts tiled replay serve steps}"
B=$w/ordo/bin
export LD_LIBRARY_PATH=$w/ordo/lib:${LD_LIBRARY_PATH:-}
log() { echo "[$(date +%T)] $*" | tee -a "$out/next.log"; }
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
tests=${TESTS:-$repo/.gpu/tests.tar.xz}
cd "$w" || { echo "no kit work dir $w" >&2; exit 3; }

# Correctness first: the GPU test binaries (the cooperative-matrix kernel's among them) on this
# driver, against the CPU reference.
part_tests() {
  if [ -f "$tests" ]; then
    log "gpu tests ($tests)"
    BUDGET_S=${TESTS_S:-120} bash "$repo/bench/gpu_tests.sh" run "$tests" "$out" |
      tee -a "$out/next.log"
  fi
}

# The cooperative-matrix mat-mul (mul_mat_cm.comp, session 28): its outputs checked against the
# invariant kernel's on every line (coop_err), its tiles A/B'd (subgroup rows, fragment rows,
# fragment tokens: 2,2,2 is 64 x 64; 2,4,4 128 x 128; 2,4,2 128 x 64; 1,4,2 64 x 128; 4,2,2
# 128 x 32).
part_coop() {
  for a in "" "--coop-wide 2,4,4" "--coop-wide 2,4,2" "--coop-wide 1,4,2" "--coop-wide 4,2,2" \
    "--coop-split-wg 0"; do
    log "ordo-bench-kernels --prefill-1b --coop 1 $a"
    # shellcheck disable=SC2086
    timeout 120 "$B/ordo-bench-kernels" --prefill-1b --types q4_k,f16 --coop 1 $a \
      2>>"$out/next.err" | grep '"tiled"' >>"$out/next.jsonl"
    log "rc=${PIPESTATUS[0]}"
  done
  log "ordo-bench $MODEL --batch-invariant off"
  timeout 150 "$B/ordo-bench" --model "$MODEL.gguf" --prompts "$PP" --gen "$TG" --parallel "$PAR" \
    --reps 2 --json --label "$MODEL-coop" --batch-invariant off >>"$out/next.jsonl" \
    2>"$out/coop.err"
  log "rc=$?"
  # The runner's warm-up choices (the large tile's wide/large times at 64..512 tokens).
  grep -E "serves|batch_invariant|cooperative-matrix kernel" "$out/coop.err" | tee -a "$out/next.log"
  cat "$out/coop.err" >>"$out/next.err"
  rm -f "$out/coop.err"
}

# Each weight's one-token mul_mat_vec shape, measured at warm-up (session 30): batch-1 decode
# with the measured shapes and with the tuning's everywhere, alternately, on the Q4_K and the
# F16 1B file; the warm-up's times per role and shape go to next.log.
part_mmv() {
  for m in "$MODEL" l1b-f16; do
    [ -f "$m.gguf" ] || continue
    for v in on off on off; do
      log "ordo-bench $m --parallel 1 --mmv-shapes $v"
      timeout 120 "$B/ordo-bench" --model "$m.gguf" --prompts 16 --gen "$TG" --parallel 1 \
        --reps 3 --json --label "$m-mmv-$v" --mmv-shapes "$v" >>"$out/next.jsonl" 2>"$out/mmv.err"
      log "rc=$?"
      grep "mul_mat_vec shapes" "$out/mmv.err" | tee -a "$out/next.log"
      cat "$out/mmv.err" >>"$out/next.err"
    done
  done
  rm -f "$out/mmv.err"
}

# RoPE and the KV store in the q|k|v mat-vec's store (session 33; the same bits): one dispatch
# and one barrier a layer fewer at decode. Batch-1 and 16-sequence decode, on and off in turn.
part_rope() {
  for v in on off on off; do
    log "ordo-bench $MODEL --parallel 1,16 --qkv-rope $v"
    timeout 120 "$B/ordo-bench" --model "$MODEL.gguf" --prompts 16 --gen "$TG" --parallel 1,16 \
      --reps 3 --json --label "$MODEL-qkv-rope-$v" --qkv-rope "$v" >>"$out/next.jsonl" \
      2>>"$out/next.err"
    log "rc=$?"
  done
}

# attention.comp's load groups (session 32; no bit depends on them): K pairs and V keys a lane
# loads before using them. One 1B layer's decode attention (1 sequence at 16..4096 keys, 64 at
# 64 and 512) at the default 4,8 and larger groups (a group of 64 keys is the whole tile where
# the workgroup is 64, NVIDIA's; refused where it is 32), then batch-1 and 64-sequence decode at
# the default and the largest, alternately.
part_attn() {
  for g in "4 8" "8 16" "16 32" "32 32" "32 64"; do
    # shellcheck disable=SC2086
    set -- $g
    log "ordo-bench-kernels --decode-attention --attn-k-pairs $1 --attn-v-group $2"
    timeout 90 "$B/ordo-bench-kernels" --no-texel --decode-attention --attn-k-pairs "$1" \
      --attn-v-group "$2" 2>>"$out/next.err" | grep '"kernel"' >>"$out/next.jsonl"
    log "rc=${PIPESTATUS[0]}"
  done
  for g in "4 8" "32 64" "4 8" "32 64"; do
    # shellcheck disable=SC2086
    set -- $g
    log "ordo-bench $MODEL --attn-k-pairs $1 --attn-v-group $2"
    timeout 120 "$B/ordo-bench" --model "$MODEL.gguf" --prompts 16 --gen "$TG" --parallel 1,64 \
      --reps 2 --json --label "$MODEL-attn-$1-$2" --attn-k-pairs "$1" --attn-v-group "$2" \
      >>"$out/next.jsonl" 2>>"$out/next.err"
    log "rc=$?"
  done
}

# The invariant tiled mul_mat's layouts, measured at warm-up at 16, 64 and 512 tokens (session
# 30): prefill and 16 / 64 sequences with the measured layouts and with the tuning's.
part_layouts() {
  for v in on off; do
    log "ordo-bench $MODEL --mm-layouts $v"
    timeout 150 "$B/ordo-bench" --model "$MODEL.gguf" --prompts "$PP" --gen "$TG" \
      --parallel 16,64 --reps 2 --json --label "$MODEL-layouts-$v" --mm-layouts "$v" \
      >>"$out/next.jsonl" 2>"$out/layouts.err"
    log "rc=$?"
    grep "layouts by token count" "$out/layouts.err" | tee -a "$out/next.log"
    cat "$out/layouts.err" >>"$out/next.err"
  done
  rm -f "$out/layouts.err"
}

# The tiled mat-mul's layouts (gpu/PERF.md session 27; no bit depends on them): the GPUs' default
# (staged by parts into swizzled tiles, token tiles first, narrow tiles for 16 tokens, K step
# 32), each knob turned, staging by rows, and the layout before session 27.
part_tiled() {
  for a in "" "--mm-swizzle 0" "--mm-tokens-first 0" "--mm-narrow 0" "--mm-k-step 64" \
    "--mm-row-stage 1" "--mm-row-stage 1 --mm-k-step 64" \
    "--mm-swizzle 0 --mm-tokens-first 0 --mm-narrow 0"; do
    log "ordo-bench-kernels --prefill-1b $a"
    # shellcheck disable=SC2086
    timeout 120 "$B/ordo-bench-kernels" --prefill-1b --types q4_k,f16 $a 2>>"$out/next.err" |
      grep '"tiled"' >>"$out/next.jsonl"
    log "rc=${PIPESTATUS[0]}"
  done
}

part_replay() {
  log "ordo-bench $MODEL --replay off"
  timeout 150 "$B/ordo-bench" --model "$MODEL.gguf" --prompts "$PP" --gen "$TG" --parallel "$PAR" \
    --reps 2 --json --label "$MODEL-replay-off" --replay off >>"$out/next.jsonl" 2>>"$out/next.err"
  log "rc=$?"
}

# One server per config, its HTTP door on a free port; /metrics' gpu counters after each load.
serve() {  # label, config text[, streams, the load's sampler options]
  local label=$1 cfg=$w/next-$1.toml port pid streams=${3:-$STREAMS}
  local sampler=${4:---temperature 1 --top-k 40 --seed 7}
  printf '%b' "$2" >"$cfg"
  "$B/ordo-server" --model "$MODEL.gguf" --config "$cfg" --listen 127.0.0.1:0 \
    --http-listen 127.0.0.1:0 >"$w/next-$label.log" 2>&1 &
  pid=$!
  for _ in $(seq 240); do
    port=$(grep -o 'http listening on 127.0.0.1:[0-9]*' "$w/next-$label.log" | head -1 |
      sed 's/.*://')
    [ -n "$port" ] && curl -sf "127.0.0.1:$port/health" | grep -q '"ok"' && break
    sleep 0.5
  done
  # The start-up's timestamps too: starting -> the pool's size (context line) -> device ready,
  # the KV pool's clearing on the device between them (session 38).
  grep -E "ordo-server starting|the device's choice|runner: context|runner: warm-up steps|device ready \(epoch|serves|cooperative-matrix kernel" \
    "$w/next-$label.log" | tee -a "$out/next.log"
  if [ -n "$port" ]; then
    for s in ${streams//,/ }; do
      log "ordo-load $label, $s streams"
      # shellcheck disable=SC2086 # the sampler options are words
      timeout 150 "$B/ordo-load" --protocol http --port "$port" --streams "$s" --requests 2 \
        --prompt-tokens 128 --max-tokens "$TG" $sampler \
        --duration-max-s 140 --label "ordo-gpu/$MODEL-$label" >>"$out/next.jsonl" \
        2>>"$out/next.err"
      log "rc=$?"
      curl -s "127.0.0.1:$port/metrics" |
        grep -E '^ordo_gpu_(steps|busy|run|step_wall|between|back|segments)|^ordo_scheduler_decode_(iterations|steps_ended)' |
        sed "s/^/$label $s streams: /" >>"$out/next.log"
    done
  else
    log "$label: the server did not come up"
  fi
  kill "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
}

part_serve() {
  serve choice '[scheduler]\nmax_queue = 1024\n'
  serve coop '[gpu]\nbatch_invariant = false\n[scheduler]\nmax_queue = 1024\n'
  serve "batch$BATCH_TOKENS" "[scheduler]\nmax_queue = 1024\nmax_batch_tokens = $BATCH_TOKENS\n"
}

# Greedy streams with scheduler.decode_steps 1, 4 (the default) and 8 (session 35: several decode
# iterations a step, each greedy draw fed to the next on the worker, never run on a GPU); then
# sampled ones (the serve part's temperature 1, top-k 40) with 1 and 4 (session 36: a copy of
# each request's sampler draws between the iterations, from the row summaries on a GPU), at 64
# and 128 streams too (session 37: where rows are summarized a step of every sequence runs
# ahead, and it does while requests wait for a busy sequence: 128 streams on 64).
part_steps() {
  for k in 1 4 8; do
    serve "steps$k" "[scheduler]\nmax_queue = 1024\ndecode_steps = $k\n" "${STEP_STREAMS:-1,8}" \
      "--temperature 0"
  done
  for k in 1 4; do
    serve "sampled$k" "[scheduler]\nmax_queue = 1024\ndecode_steps = $k\n" "${STEP_STREAMS:-1,8,64,128}"
  done
}

for p in $PARTS; do
  if declare -F "part_$p" >/dev/null; then "part_$p"; else log "no part $p"; fi
done
log "done"
