#!/usr/bin/env bash
# tools/dev.sh: the one entry point for setting up, building, testing and running ordo on a
# fresh Debian machine. Idempotent: packages are installed only when missing, the build is
# configured only once.
#
#   bash tools/dev.sh setup   install Debian packages (apt-get) and configure the build
#   bash tools/dev.sh build   setup + build everything
#   bash tools/dev.sh test    build + the openai Node client for tests/http + run every test
#   bash tools/dev.sh run     build + start ordo-server on etc/ordo.toml (extra args passed on)
#   bash tools/dev.sh soak [N] build + a fault soak: ordo-fault's random mode, N requests
#                             (default 10000; not part of `test`), on ../shared's stories260K
#   bash tools/dev.sh loaded-test  `test` with Debian's stress-ng loading every core alongside
#                             (a busy machine must not fail a test; not part of CI)
#   bash tools/dev.sh format  clang-format (Debian 12's, .clang-format) every C++ source in place
#   bash tools/dev.sh format-check  fail naming the files clang-format would change (CI runs it)
#
# Environment: ORDO_BUILD_DIR (default build), ORDO_SANITIZE=1 (ASan+UBSan build in
# build-asan), ORDO_JOBS (default: nproc), ORDO_SOAK_SEED (default 1), ORDO_SOAK_MODEL.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

packages=(
  cmake ninja-build pkg-config g++ git
  libuv1-dev libxxhash-dev libpcre2-dev libvulkan-dev glslang-dev glslang-tools
  libmsgpack-cxx-dev libspdlog-dev libtomlplusplus-dev nlohmann-json3-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  mesa-vulkan-drivers vulkan-tools python3-msgpack python3-jsonschema python3-yaml
  node-llhttp prometheus curl clang-format haproxy
)

sanitize="${ORDO_SANITIZE:-0}"
if [[ "$sanitize" == 1 ]]; then
  build_dir="${ORDO_BUILD_DIR:-build-asan}"
else
  build_dir="${ORDO_BUILD_DIR:-build}"
fi
jobs="${ORDO_JOBS:-$(nproc)}"

log() { printf '[dev.sh] %s\n' "$*" >&2; }

install_packages() {
  local missing=()
  for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if ((${#missing[@]} == 0)); then
    log "all Debian packages present"
    return
  fi
  log "installing: ${missing[*]}"
  local sudo=()
  if [[ $(id -u) -ne 0 ]]; then sudo=(sudo); fi
  "${sudo[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
}

configure() {
  if [[ -f "$build_dir/build.ninja" ]]; then return; fi
  local opts=(-G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo)
  if [[ "$sanitize" == 1 ]]; then opts+=(-DORDO_SANITIZE=ON); fi
  log "configuring $build_dir"
  cmake -S . -B "$build_dir" "${opts[@]}" >/dev/null
}

# The HTTP tests (tests/http) drive the server with OpenAI's own Node client, the `openai` package,
# and with the agent libraries users reach for (LangChain's `@langchain/openai`, the Vercel AI
# SDK's `ai` + `@ai-sdk/openai`, with `zod` for their schemas): from the npm registry, at pinned
# versions, installed into $build_dir/node (not the system). Node itself comes from Debian
# (nodejs, npm) unless a node and npm are already installed.
node_packages=(openai@6.49.0 @langchain/openai@1.5.8 @langchain/core@1.4.0 ai@6.0.326
               @ai-sdk/openai@3.0.141 zod@4.6.7)
install_node_client() {
  if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
    local sudo=()
    if [[ $(id -u) -ne 0 ]]; then sudo=(sudo); fi
    log "installing nodejs and npm"
    "${sudo[@]}" apt-get update -qq
    DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends \
      nodejs npm >/dev/null
  fi
  local stamp="$build_dir/node/installed.txt"
  if [[ -f "$stamp" && "$(cat "$stamp")" == "${node_packages[*]}" ]]; then return; fi
  log "installing the Node clients ${node_packages[*]} into $build_dir/node"
  mkdir -p "$build_dir/node"
  if npm install --prefix "$build_dir/node" --no-audit --no-fund --no-save \
    "${node_packages[@]}" >/dev/null; then
    echo "${node_packages[*]}" > "$stamp"
  else
    log "WARNING: npm could not install ${node_packages[*]}: the Node client tests of" \
        "tests/http skip (and fail where ORDO_HTTP_CLIENT_REQUIRED=1, as in CI)"
  fi
}

setup() { install_packages; configure; }
build() { setup; log "building ($jobs jobs)"; cmake --build "$build_dir" -j "$jobs"; }

run_tests() {
  build
  install_node_client
  export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-/tmp}"
  if [[ "$sanitize" == 1 ]]; then
    export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=0:abort_on_error=1}"
    export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
  fi
  if [[ ! -d "$root/../shared/models" ]]; then
    log "NOTE: ../shared/models is absent: tests that need the real test models will SKIP"
  fi
  ctest --test-dir "$build_dir" --output-on-failure -j "$jobs" --timeout 900
}

# The embedded default: a small random-weight Llama with a byte vocab, generated once so the
# server has something to serve on a fresh machine (etc/ordo.toml: model.generated_path).
default_model=var/models/ordo-default.gguf
make_default_model() {
  if [[ -f "$default_model" ]]; then return; fi
  mkdir -p "$(dirname "$default_model")"
  log "generating the default model $default_model (random weights; see README to serve a real GGUF)"
  "$build_dir/tools/model/ordo-model" mk --out "$default_model" --n-embd 256 --n-layer 4 \
    --n-head 8 --n-head-kv 4 --n-ff 768 --n-vocab 512 --type f16 --seed 1 --ctx 2048 >/dev/null
}

run_server() {
  build
  make_default_model
  export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-/tmp}"
  exec "$build_dir/tools/server/ordo-server" --config etc/ordo.toml "$@"
}

# The long random fault run the issue calls a soak: the summary (requests, faults by kind,
# violations, resident memory after warm-up, at the end and at peak) is the last line.
run_soak() {
  build
  local model="${ORDO_SOAK_MODEL:-$root/../shared/models/stories260K.gguf}"
  if [[ ! -f "$model" ]]; then
    log "no model at $model (set ORDO_SOAK_MODEL)"
    exit 2
  fi
  export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-/tmp}"
  "$build_dir/tools/fault/ordo-fault" --model "$model" --seed "${ORDO_SOAK_SEED:-1}" \
    --requests "${1:-10000}" --json
}

# The whole suite on a machine whose every core is busy with something else (stress-ng's CPU
# workers at full load): start-up, timeouts and the watchdog must tell slow from hung.
run_loaded_tests() {
  if ! command -v stress-ng >/dev/null; then
    local sudo=()
    if [[ $(id -u) -ne 0 ]]; then sudo=(sudo); fi
    log "installing stress-ng"
    "${sudo[@]}" apt-get update -qq
    DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends \
      stress-ng >/dev/null
  fi
  build
  log "stress-ng --cpu $(nproc) alongside the tests"
  stress-ng --cpu "$(nproc)" --timeout 0 --quiet &
  stress_pid=$!
  trap 'kill "$stress_pid" 2>/dev/null || true' EXIT
  local rc=0
  run_tests || rc=$?
  kill "$stress_pid" 2>/dev/null || true
  wait "$stress_pid" 2>/dev/null || true
  return "$rc"
}

# Every tracked C++ source but the shaders' shared header folder (GLSL reads abi.h too).
cxx_sources() { git ls-files '*.cpp' '*.hpp' '*.h' | grep -v '^gpu/vk/shaders/'; }

format_sources() { install_packages; cxx_sources | xargs clang-format -i; }

# One clang-format process per 40 files, $jobs at a time (a process per file spent 45 s of CI in
# start-ups); --dry-run names each unformatted file in a "FILE:LINE:COL: error:" line.
check_format() {
  install_packages
  local out
  out=$(cxx_sources | xargs -P "$jobs" -n 40 clang-format --dry-run --Werror 2>&1) || true
  local bad
  bad=$(grep -oE '^[^:]+:[0-9]+:[0-9]+: error' <<< "$out" | cut -d: -f1 | sort -u | paste -sd ' ' -) || true
  if [[ -n "$bad" ]]; then
    log "not formatted (bash tools/dev.sh format fixes them): $bad"
    return 1
  fi
  if [[ -n "$out" ]]; then
    log "clang-format failed: $out"
    return 1
  fi
  log "every C++ source is formatted ($(clang-format --version | head -1))"
}

case "${1:-}" in
  setup) setup ;;
  build) build ;;
  test) run_tests ;;
  run) shift; run_server "$@" ;;
  soak) shift; run_soak "$@" ;;
  loaded-test) run_loaded_tests ;;
  format) format_sources ;;
  format-check) check_format ;;
  *) sed -n '2,20p' "$0"; exit 2 ;;
esac
