// toy_layers.hpp: a toy stack of F16 layers, x += W_l rmsnorm(x) per layer, shared by
// test_segments.cpp and test_stream_replay.cpp: real norm and mat-mul dispatches whose results
// two ways of recording them must agree on bit for bit.
#pragma once

#include <vector>

#include "gpu/vk/weights.hpp"
#include "gpu_fixture.hpp"
#include "model/quant.hpp"

namespace ordo::gpu::testing {

struct toy_layers {
    static constexpr std::uint32_t dim = 64, tokens_max = 4;

    // Layer l's weights are random_floats(dim * dim, seed0 + l) in F16.
    toy_layers(std::uint32_t n_layer, std::uint32_t seed0) : mem(*env().dev, 1u << 20) {
        for (std::uint32_t l = 0; l < n_layer; ++l) {
            auto f = random_floats(dim * dim, seed0 + l, 0.2f);
            std::vector<std::uint8_t> bytes(f.size() * 2);
            EXPECT_TRUE(
                model::quantize_row(model::ggml_type::f16, f.data(), bytes.data(), f.size()).ok());
            auto t = upload_weight(*env().dev, mem, model::ggml_type::f16, dim, dim, bytes);
            EXPECT_TRUE(t.ok());
            w.push_back(std::move(*t));
        }
    }

    // Records layer `layer` over the first `tokens` rows of x (dim floats each) into s.
    void record(stream& s, std::uint32_t layer, std::uint32_t tokens, const buffer& x) {
        EXPECT_TRUE(encode_rms_norm(s, {whole(x), 0, dim}, whole(norm_w), {whole(tmp), 0, dim}, dim,
                                    tokens, 1e-5f)
                        .ok());
        EXPECT_TRUE(
            encode_mul_mat(s, w[layer], {whole(tmp), 0, dim}, {whole(x), 0, dim}, tokens, true)
                .ok());
    }

    arena mem;
    std::vector<weight_tensor> w;
    buffer norm_w = make_buffer(random_floats(dim, 3));
    buffer tmp = make_buffer(std::vector<float>(dim * tokens_max));
};

}  // namespace ordo::gpu::testing
