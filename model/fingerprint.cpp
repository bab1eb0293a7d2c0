// fingerprint.cpp: the 128-bit digest and the model fingerprint (see fingerprint.hpp for what
// is covered and why).
#include "model/fingerprint.hpp"

#include <bit>
#include <cstring>
#include <vector>

namespace ordo::model {

namespace {

static_assert(std::endian::native == std::endian::little,
              "fingerprint reads words little-endian; a big-endian host needs byte swaps");

// Odd 64-bit constants with well-spread bits (the golden-ratio family used by many hashes).
constexpr uint64_t k_p1 = 0x9e3779b185ebca87ull;
constexpr uint64_t k_p2 = 0xc2b2ae3d27d4eb4full;
constexpr uint64_t k_p3 = 0x165667b19e3779f9ull;
constexpr uint64_t k_p4 = 0x85ebca77c2b2ae63ull;
constexpr uint64_t k_p5 = 0x27d4eb2f165667c5ull;
constexpr uint64_t k_model_seed = 0x6f72646f2d666e67ull;  // "ordo-fng"

uint64_t read_u64(const uint8_t* p) {
    uint64_t v;
    std::memcpy(&v, p, sizeof v);
    return v;
}

// One lane step: mixes word w into acc so every input bit reaches many output bits.
uint64_t lane_round(uint64_t acc, uint64_t w) {
    acc += w * k_p2;
    acc = std::rotl(acc, 31);
    return acc * k_p1;
}

// Final avalanche: every input bit flips about half of the output bits.
uint64_t avalanche(uint64_t h) {
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 33;
    return h;
}

char hex_digit(unsigned v) {
    return static_cast<char>(v < 10 ? '0' + v : 'a' + v - 10);
}

}  // namespace

fingerprint hash_bytes(std::span<const uint8_t> bytes, uint64_t seed) {
    const uint8_t* p = bytes.data();
    const size_t n = bytes.size();
    uint64_t v[4] = {seed + k_p1 + k_p2, seed + k_p2, seed, seed - k_p1};
    // Four independent lanes over 32-byte stripes keep the multipliers busy in parallel.
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        v[0] = lane_round(v[0], read_u64(p + i));
        v[1] = lane_round(v[1], read_u64(p + i + 8));
        v[2] = lane_round(v[2], read_u64(p + i + 16));
        v[3] = lane_round(v[3], read_u64(p + i + 24));
    }
    // Whole words of the tail, then the last bytes zero-padded (the length is mixed in below,
    // so trailing zero bytes still change the digest).
    size_t lane = 0;
    for (; i + 8 <= n; i += 8, ++lane) v[lane] = lane_round(v[lane], read_u64(p + i));
    if (i < n) {
        uint64_t last = 0;
        std::memcpy(&last, p + i, n - i);
        v[lane] = lane_round(v[lane], last ^ k_p5);
    }
    const uint64_t len = static_cast<uint64_t>(n);
    const uint64_t a =
        (std::rotl(v[0], 1) + std::rotl(v[1], 7) + std::rotl(v[2], 12) + std::rotl(v[3], 18)) ^
        (len * k_p3);
    const uint64_t b =
        std::rotl(v[0] ^ v[2], 23) * k_p3 + std::rotl(v[1] ^ v[3], 41) * k_p4 + len * k_p5;
    fingerprint f;
    f.lo = avalanche(a);
    f.hi = avalanche(b ^ f.lo);
    return f;
}

std::string fingerprint::hex() const {
    std::string s(32, '0');
    for (int i = 0; i < 16; ++i) {
        s[i] = hex_digit(static_cast<unsigned>(hi >> (60 - 4 * i)) & 0xfu);
        s[16 + i] = hex_digit(static_cast<unsigned>(lo >> (60 - 4 * i)) & 0xfu);
    }
    return s;
}

result<fingerprint> fingerprint::from_hex(std::string_view text) {
    if (text.size() != 32) {
        return make_error("fingerprint_bad_hex", "a fingerprint is 32 hex digits, got " +
                                                     std::to_string(text.size()) + " characters");
    }
    fingerprint f;
    for (size_t i = 0; i < 32; ++i) {
        const char c = text[i];
        unsigned d;
        if (c >= '0' && c <= '9')
            d = static_cast<unsigned>(c - '0');
        else if (c >= 'a' && c <= 'f')
            d = static_cast<unsigned>(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            d = static_cast<unsigned>(c - 'A' + 10);
        else
            return make_error("fingerprint_bad_hex", "not a hex digit at " + std::to_string(i));
        uint64_t& half = i < 16 ? f.hi : f.lo;
        half = (half << 4) | d;
    }
    return f;
}

fingerprint model_fingerprint(const gguf_file& file, const llama_hparams& hp) {
    // Everything covered goes into one word list, then one final digest over it.
    std::vector<uint64_t> words;
    words.reserve(16 + file.tensors().size() * 12);
    words.push_back(k_model_seed);
    words.push_back(k_fingerprint_version);
    for (uint32_t v : {hp.n_embd, hp.n_layer, hp.n_head, hp.n_head_kv, hp.n_ff, hp.n_ctx,
                       hp.n_vocab, hp.n_rot}) {
        words.push_back(v);
    }
    words.push_back(std::bit_cast<uint32_t>(hp.rope_freq_base));
    words.push_back(std::bit_cast<uint32_t>(hp.rms_eps));
    // Linear RoPE scaling changes every position's rotation. Covered only when in use, so the
    // fingerprints of unscaled models (and the KV files stamped with them) stay what they were.
    // rope_freqs.weight factors are a tensor: item 3 covers them.
    if (hp.rope_scale_linear != 1.0f) {
        words.push_back(std::bit_cast<uint32_t>(hp.rope_scale_linear));
    }
    words.push_back(file.tensors().size());
    for (const auto& t : file.tensors()) {
        const auto name = std::span(reinterpret_cast<const uint8_t*>(t.name.data()), t.name.size());
        const fingerprint name_digest = hash_bytes(name, k_p4);
        const fingerprint data_digest = hash_bytes(t.data, k_p3);
        words.push_back(name_digest.hi);
        words.push_back(name_digest.lo);
        words.push_back(static_cast<uint64_t>(t.type));
        words.push_back(t.n_dims);
        for (uint64_t d : t.ne) words.push_back(d);
        words.push_back(data_digest.hi);
        words.push_back(data_digest.lo);
    }
    const auto bytes =
        std::span(reinterpret_cast<const uint8_t*>(words.data()), words.size() * sizeof(uint64_t));
    return hash_bytes(bytes, k_model_seed);
}

result<fingerprint> model_fingerprint(const gguf_file& file) {
    auto hp = read_llama_hparams(file);
    if (!hp) return hp.err();
    return model_fingerprint(file, *hp);
}

}  // namespace ordo::model
