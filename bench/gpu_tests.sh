#!/usr/bin/env bash
# gpu_tests.sh: ordo's GPU test binaries on a lent device, so a device call checks the kernels
# and paths that CI checks on lavapipe against the CPU reference on the real driver too (the
# cooperative-matrix mat-mul runs only there; logits written in place, replayed segments, row
# summaries and the tiled layouts have NVIDIA-specific choices). Not a benchmark: pass/fail and
# the first failures' messages.
#
#   bash bench/gpu_tests.sh pack BUILD_DIR DEST   DEST/tests.tar.xz: the binaries below, stripped
#                                                  (about 2.5 MB; carry DEST with the kit's .gpu)
#   bash bench/gpu_tests.sh run ARCHIVE OUT       unpacks and runs them in order, each under
#                                                  PER_S seconds (60), none started past BUDGET_S
#                                                  (150) in all; OUT/tests.log gets gtest's brief
#                                                  output and a summary line per binary
#
# The kit's libraries (spdlog, fmt, xxhash) come from LD_LIBRARY_PATH (bench/gpu_next.sh sets it
# to the kit's ordo/lib). Tests that need ../shared skip there, saying so.
set -uo pipefail
# The cooperative-matrix kernel and runner first (never run on a GPU before session 29's call),
# then the tests of what sessions 21-28 added, then the rest of the kernels.
binaries=(gpu_test_mul_mat_coop gpu_test_runner gpu_test_runner_logits_in_place
  gpu_test_runner_replay gpu_test_stream_replay gpu_test_logits_summary gpu_test_batch_invariance
  gpu_test_decode_fusion gpu_test_attention gpu_test_kernels)

case ${1:-} in
  pack)
    build=${2:?build dir} dest=${3:?dest dir}
    stage=$(mktemp -d)
    mkdir -p "$stage/tests" "$dest"
    for b in "${binaries[@]}"; do
      strip -o "$stage/tests/$b" "$build/tests/gpu/$b" || exit 1
    done
    tar -C "$stage" -cJf "$dest/tests.tar.xz" tests
    rm -rf "$stage"
    ls -la "$dest/tests.tar.xz"
    ;;
  run)
    archive=${2:?archive} out=${3:?out dir}
    : "${PER_S:=60}" "${BUDGET_S:=150}"
    mkdir -p "$out"
    dir=$(mktemp -d)
    tar -C "$dir" -xJf "$archive" || exit 1
    start=$SECONDS
    for b in "${binaries[@]}"; do
      if ((SECONDS - start >= BUDGET_S)); then
        echo "$b: not run (the ${BUDGET_S} s budget is spent)" | tee -a "$out/tests.log"
        continue
      fi
      t0=$SECONDS
      # The runner binary's cooperative-matrix test first: it is the one never run on a GPU.
      # (The runners' info lines are dropped: their warnings and errors stay.)
      if [ "$b" = gpu_test_runner ]; then
        (cd "$dir" && timeout "$PER_S" "./tests/$b" --gtest_brief=1 \
          --gtest_filter='Runner.NotBatchInvariant*') 2>&1 | grep -v '\] \[info\] ' >>"$out/tests.log"
      fi
      (cd "$dir" && timeout "$PER_S" "./tests/$b" --gtest_brief=1) 2>&1 |
        grep -v '\] \[info\] ' >>"$out/tests.log"
      rc=${PIPESTATUS[0]}
      echo "== $b: rc=$rc in $((SECONDS - t0)) s" | tee -a "$out/tests.log"
    done
    rm -rf "$dir"
    ;;
  *)
    echo "usage: gpu_tests.sh pack BUILD_DIR DEST | run ARCHIVE OUT" >&2
    exit 2
    ;;
esac
