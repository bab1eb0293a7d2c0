// spin_until.comp (tests only): polls flag[0] until the host writes a nonzero value into the
// (host-visible, coherent) buffer. Each of the dispatch's workgroups (one invocation) polls at
// most p.iterations times (encode_spin_until: ORDO_SPIN_POLLS where the driver caps loops,
// ORDO_SPIN_POLLS_UNCAPPED elsewhere): llvmpipe ends every loop of an invocation after 65535
// iterations in total (LP_MAX_TGSI_LOOP_ITERATIONS), so there the length of the dispatch comes
// from its workgroup count; a GPU runs all the workgroups at once and leaves the loop when it
// sees the flag, so there the poll count gives the length. An invocation that saw the flag sets bit 0 of flag[1], one that gave up
// sets bit 1. (llvmpipe runs the loop to its bound with the lane masked off even after the
// break, about 0.2 ms per workgroup, so there the flag shortens nothing; it shows that the
// dispatch was still running when the host set it.) The deterministic input of the watchdog
// test (tests/gpu/test_segments.cpp): a dispatch still running when a short fence wait gives up.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "abi.h"
layout(local_size_x = 1) in;
layout(push_constant) uniform push_block { spin_push p; };
layout(std430, binding = ORDO_B_SPIN_DATA) coherent buffer flag_buf { uint flag[]; };

void main() {
    bool seen = false;
    for (uint j = 0; j < p.iterations; ++j) {
        // An atomic read: a plain (even volatile) load is hoisted out of the loop by
        // llvmpipe's compiler, which then deletes the loop.
        if (atomicOr(flag[0], 0u) != 0u) {
            seen = true;
            break;
        }
    }
    atomicOr(flag[1], seen ? 1u : 2u);
}
