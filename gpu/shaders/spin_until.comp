// spin_until.comp (tests only): one invocation polls flag[0] until the host writes a nonzero
// value into the (host-visible, coherent) buffer, then sets flag[1] = 1; after
// p.iterations x 65536 polls it gives up and sets flag[1] = 2. A dispatch that is certainly
// still running when a short fence wait gives up, whatever the machine's load: the
// deterministic input of the watchdog test (tests/gpu/test_segments.cpp).
#version 450
#extension GL_GOOGLE_include_directive : require
#include "abi.h"
layout(local_size_x = 1) in;
layout(push_constant) uniform push_block { spin_push p; };
layout(std430, binding = ORDO_B_SPIN_DATA) coherent buffer flag_buf { uint flag[]; };

void main() {
    for (uint i = 0; i < p.iterations; ++i) {
        for (uint j = 0; j < 65536u; ++j) {
            // An atomic read: a plain (even volatile) load is hoisted out of the loop by
            // llvmpipe's compiler, which then deletes the loop.
            if (atomicOr(flag[0], 0u) != 0u) {
                flag[1] = 1u;
                return;
            }
        }
    }
    flag[1] = 2u;
}
