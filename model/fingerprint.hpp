// fingerprint.hpp: a stable 128-bit identity of a model's weights and geometry.
//
// Owns the definition of "the same model". Users: the kv actor stamps it into every persisted
// KV file and refuses a file whose stamp differs (ARCHITECTURE.md F7); `ordo-model info` prints
// it. Pure function of the file's content, deterministic across runs, machines and builds.
//
// What it covers, in this order:
//   1. a format tag and version (k_fingerprint_version), so a change of this definition can
//      never silently match an old stamp;
//   2. the Llama hyperparameters that change the computation: n_embd, n_layer, n_head,
//      n_head_kv, n_ff, n_ctx, n_vocab, n_rot, rope freq base and rms eps (float bits), and the
//      linear RoPE scaling factor where it is not 1;
//   3. for every tensor in the file's table, in table order: its name, type id, n_dims, every
//      ne, and a digest of its data bytes.
// It does not cover the rest of the metadata (tokenizer, names, licence): two files with the same
// weights and geometry but a retitled `general.name` share a fingerprint. Tensor offsets and the
// alignment are not covered either (they do not change the math).
//
// The hash is a non-cryptographic xxhash-style design written for ordo: four 64-bit lanes over
// 32-byte stripes (multiply-rotate-multiply rounds), folded into two differently mixed 64-bit
// halves. It detects corruption and accidental mismatch, not an adversary. Speed: several GB/s
// on one core, so a 200 MB model takes well under a second.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "actors/runtime/result.hpp"
#include "model/gguf.hpp"
#include "model/llama.hpp"

namespace ordo::model {

inline constexpr uint32_t k_fingerprint_version = 1;

struct fingerprint {
    uint64_t hi = 0;
    uint64_t lo = 0;

    // 32 lower-case hex digits, hi first.
    std::string hex() const;
    // Parses hex() output. Error: fingerprint_bad_hex.
    static result<fingerprint> from_hex(std::string_view text);

    bool operator==(const fingerprint&) const = default;
};

// One-shot 128-bit digest of bytes (the building block; exposed for tests and for the kv actor's
// per-block checksums).
fingerprint hash_bytes(std::span<const uint8_t> bytes, uint64_t seed = 0);

// The model fingerprint described above.
fingerprint model_fingerprint(const gguf_file& file, const llama_hparams& hp);

// Convenience: reads the hparams first. Errors: those of read_llama_hparams.
result<fingerprint> model_fingerprint(const gguf_file& file);

}  // namespace ordo::model
