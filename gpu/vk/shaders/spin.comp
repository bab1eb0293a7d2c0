// spin.comp: test-only long-running dispatch. Call site: gpu/vk/kernels.cpp encode_spin(), used by
// tests/gpu to make a submission outlive a tiny watchdog so the real fence-timeout path runs.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "abi.h"
layout(local_size_x = 1) in;
layout(push_constant) uniform push_block { spin_push p; };
layout(std430, binding = ORDO_B_SPIN_DATA) buffer data_buf { float data[]; };

void main() {
    float v = data[0];
    for (uint i = 0; i < p.iterations; ++i) {
        v = v * 1.0000001 + data[i % p.n];
    }
    data[0] = v;
}
