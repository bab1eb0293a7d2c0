// synth.cpp: synthetic Llama GGUF generator (see synth.hpp for the recipe). The header comes
// from gguf_writer with every tensor added "raw" (no bytes, offsets computed here), then the
// tensor data is streamed after it row by row through a bounded write buffer.
#include "model/synth.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cassert>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <unordered_set>

#include "actors/runtime/splitmix64.hpp"
#include "model/fingerprint.hpp"
#include "model/gguf.hpp"
#include "model/gguf_writer.hpp"
#include "model/llama.hpp"
#include "model/quant.hpp"
#include "model/vocab.hpp"

namespace ordo::model {

namespace {

constexpr uint32_t k_alignment = 32;
// Bytes buffered before a write(2): large enough that syscalls are cheap, small enough that
// memory stays flat whatever the model size.
constexpr size_t k_write_buffer_bytes = 4u << 20;

error bad_options(const std::string& what) {
    return make_error("synth_bad_options", what);
}

bool is_synth_type(ggml_type t) {
    return is_supported(t);
}

// llama.cpp's general.file_type (its llama_ftype) for an all-`t` model, norms excepted. For a
// K type it is the "_S" mix's number: the closest llama.cpp name for a file of one type.
uint32_t file_type_of(ggml_type t) {
    switch (t) {
        case ggml_type::f16:
            return 1;  // MOSTLY_F16
        case ggml_type::q4_0:
            return 2;  // MOSTLY_Q4_0
        case ggml_type::q4_1:
            return 3;  // MOSTLY_Q4_1
        case ggml_type::q8_0:
            return 7;  // MOSTLY_Q8_0
        case ggml_type::q5_0:
            return 8;  // MOSTLY_Q5_0
        case ggml_type::q5_1:
            return 9;  // MOSTLY_Q5_1
        case ggml_type::q2_k:
            return 10;  // MOSTLY_Q2_K
        case ggml_type::q3_k:
            return 11;  // MOSTLY_Q3_K_S
        case ggml_type::q4_k:
            return 14;  // MOSTLY_Q4_K_S
        case ggml_type::q5_k:
            return 16;  // MOSTLY_Q5_K_S
        case ggml_type::q6_k:
            return 18;  // MOSTLY_Q6_K
        case ggml_type::bf16:
            return 32;  // MOSTLY_BF16
        default:
            return 0;  // ALL_F32
    }
}

}  // namespace

status validate_synth_options(const synth_options& o) {
    if (!is_synth_type(o.type)) {
        return bad_options("weight type " + std::string(type_name(o.type)) + " is not one of " +
                           supported_type_names());
    }
    if (o.vocab_from.empty() == (o.n_vocab == 0)) {
        return bad_options("give exactly one of --n-vocab and --vocab-from");
    }
    if (o.vocab_from.empty() && o.n_vocab < k_synth_byte_vocab_min) {
        return bad_options("n_vocab " + std::to_string(o.n_vocab) + " is below " +
                           std::to_string(k_synth_byte_vocab_min) +
                           " (3 special + 256 byte tokens)");
    }
    struct rope_value {
        const char* what;
        float v;
        bool zero_ok;  // 0: the option is off
    };
    const rope_value rope[] = {{"rope freq base", o.rope_freq_base, false},
                               {"llama3 rope factor", o.rope_llama3_factor, true},
                               {"linear rope factor", o.rope_linear, true}};
    for (const auto& r : rope) {
        if (!std::isfinite(r.v) || r.v < 0.0f || (r.v == 0.0f && !r.zero_ok)) {
            return bad_options(std::string(r.what) + " " + std::to_string(r.v) +
                               " must be finite and > 0");
        }
    }
    llama_hparams hp;
    hp.arch = "llama";
    hp.n_embd = o.n_embd;
    hp.n_layer = o.n_layer;
    hp.n_head = o.n_head;
    hp.n_head_kv = o.n_head_kv ? o.n_head_kv : o.n_head;
    hp.n_ff = o.n_ff;
    hp.n_ctx = o.n_ctx;
    hp.n_vocab = o.vocab_from.empty() ? o.n_vocab : k_synth_byte_vocab_min;  // checked later
    hp.n_rot = (o.n_head && o.n_embd % o.n_head == 0) ? o.n_embd / o.n_head : 2;
    if (hp.n_rot % 2 != 0) {
        return bad_options("head dim " + std::to_string(hp.n_rot) + " (n_embd / n_head) is odd");
    }
    if (auto st = validate_llama_hparams(hp); !st) return bad_options(st.err().message);
    // Rows are n_embd long except ffn_down's (n_ff); each must be a whole number of blocks.
    const uint32_t bs = block_size(o.type);
    const bool embd_ok = o.n_embd % bs == 0;
    if (!embd_ok || o.n_ff % bs != 0) {
        const char* tensor = embd_ok ? "blk.0.ffn_down.weight" : "token_embd.weight";
        const uint32_t row = embd_ok ? o.n_ff : o.n_embd;
        return bad_options("tensor " + std::string(tensor) + " has rows of " + std::to_string(row) +
                           " elements (" + (embd_ok ? "n_ff" : "n_embd") +
                           "), which is not a multiple of " + std::string(type_name(o.type)) +
                           "'s block of " + std::to_string(bs) + "; " +
                           std::string(type_name(o.type)) + " needs n_embd and n_ff to be " +
                           "multiples of " + std::to_string(bs));
    }
    return {};
}

// ---- vocab ---------------------------------------------------------------------------------

synth_vocab make_byte_vocab(uint32_t n_vocab) {
    synth_vocab v;
    auto add = [&](std::string piece, float score, token_type type) {
        v.pieces.push_back(std::move(piece));
        v.scores.push_back(score);
        v.types.push_back(static_cast<int32_t>(type));
    };
    add("<unk>", 0.0f, token_type::unknown);
    add("<s>", 0.0f, token_type::control);
    add("</s>", 0.0f, token_type::control);
    static const char* k_hex = "0123456789ABCDEF";
    for (int b = 0; b < 256; ++b) {
        add(std::string("<0x") + k_hex[b >> 4] + k_hex[b & 15] + ">", 0.0f, token_type::byte);
    }
    // Filler pieces, shortest first; scores fall with rank so merges prefer common short pieces.
    const std::string space = "\xe2\x96\x81";  // U+2581, SentencePiece's space
    std::unordered_set<std::string> seen(v.pieces.begin(), v.pieces.end());
    auto filler = [&](std::string piece) {
        if (v.pieces.size() >= n_vocab || !seen.insert(piece).second) return;
        add(std::move(piece), -static_cast<float>(v.pieces.size()), token_type::normal);
    };
    filler(space);
    for (char c = '!'; c <= '~'; ++c) filler(std::string(1, c));
    // Letter strings of growing length, each bare and with a leading space. Length 5 gives
    // 2 * 26^5 pieces, more than k_llama_n_vocab_max allows; the loop stops at n_vocab anyway.
    constexpr size_t k_filler_len_max = 5;
    std::string s;
    for (size_t len = 1; len <= k_filler_len_max && v.pieces.size() < n_vocab; ++len) {
        s.assign(len, 'a');
        while (v.pieces.size() < n_vocab) {
            filler(s);
            filler(space + s);
            size_t i = len;  // odometer increment over a..z
            while (i > 0 && s[i - 1] == 'z') s[--i] = 'a';
            if (i == 0) break;
            ++s[i - 1];
        }
    }
    return v;
}

// ---- RoPE ----------------------------------------------------------------------------------

std::vector<float> llama3_rope_factors(uint32_t n_rot, float freq_base, const llama3_rope& p) {
    // convert_hf_to_gguf.py (LlamaModel), in float32 as it computes them.
    const float pi = 3.14159265358979323846f;
    const float old_ctx = static_cast<float>(p.original_context);
    const float low_wavelen = old_ctx / p.low_freq_factor;
    const float high_wavelen = old_ctx / p.high_freq_factor;
    std::vector<float> factors;
    for (uint32_t i = 0; i < n_rot; i += 2) {
        const float freq =
            1.0f / std::pow(freq_base, static_cast<float>(i) / static_cast<float>(n_rot));
        const float wavelen = 2.0f * pi / freq;
        if (wavelen < high_wavelen) {
            factors.push_back(1.0f);
        } else if (wavelen > low_wavelen) {
            factors.push_back(p.factor);
        } else {
            const float smooth =
                (old_ctx / wavelen - p.low_freq_factor) / (p.high_freq_factor - p.low_freq_factor);
            factors.push_back(1.0f / ((1.0f - smooth) / p.factor + smooth));
        }
    }
    return factors;
}

// ---- weights -------------------------------------------------------------------------------

void synth_values(uint64_t seed, const std::string& name, float scale, uint64_t first, float* out,
                  size_t n) {
    const auto name_bytes = std::span(reinterpret_cast<const uint8_t*>(name.data()), name.size());
    const uint64_t key = hash_bytes(name_bytes, seed).lo;
    // Irwin-Hall: four uniforms sum to mean 2, variance 1/3; rescale to std `scale`.
    const float k = scale * std::sqrt(3.0f);
    for (size_t i = 0; i < n; ++i) {
        // splitmix64 at a counter
        const uint64_t z = splitmix64_mix(key + (first + i + 1) * splitmix64_gamma);
        float sum = 0.0f;
        for (int j = 0; j < 4; ++j) {
            sum += (static_cast<float>((z >> (16 * j)) & 0xffffu) + 0.5f) * (1.0f / 65536.0f);
        }
        out[i] = (sum - 2.0f) * k;
    }
}

// ---- file ----------------------------------------------------------------------------------

namespace {

struct planned_tensor {
    std::string name;
    ggml_type type = ggml_type::f32;
    uint64_t ne0 = 0;           // n_in
    uint64_t ne1 = 1;           // rows
    bool is_vector = false;     // one row (norms, rope_freqs): written 1-D
    std::vector<float> values;  // a tensor of given values (rope_freqs), else generated
    uint64_t offset = 0;        // relative to the data section
};

std::vector<planned_tensor> plan_tensors(const synth_options& o, uint32_t n_vocab) {
    const uint32_t n_head_kv = o.n_head_kv ? o.n_head_kv : o.n_head;
    const uint64_t kv_dim = uint64_t{n_head_kv} * (o.n_embd / o.n_head);
    std::vector<planned_tensor> p;
    auto mat = [&](std::string name, uint64_t ne0, uint64_t ne1) {
        p.push_back({std::move(name), o.type, ne0, ne1, false, {}, 0});
    };
    auto norm = [&](std::string name) {
        p.push_back({std::move(name), ggml_type::f32, o.n_embd, 1, true, {}, 0});
    };
    if (o.rope_llama3_factor > 0.0f) {
        llama3_rope r;
        r.factor = o.rope_llama3_factor;
        auto f = llama3_rope_factors(o.n_embd / o.n_head, o.rope_freq_base, r);
        const uint64_t n = f.size();
        p.push_back({"rope_freqs.weight", ggml_type::f32, n, 1, true, std::move(f), 0});
    }
    mat("token_embd.weight", o.n_embd, n_vocab);
    norm("output_norm.weight");
    if (!o.tied) mat("output.weight", o.n_embd, n_vocab);
    for (uint32_t il = 0; il < o.n_layer; ++il) {
        const std::string b = "blk." + std::to_string(il) + ".";
        norm(b + "attn_norm.weight");
        mat(b + "attn_q.weight", o.n_embd, o.n_embd);
        mat(b + "attn_k.weight", o.n_embd, kv_dim);
        mat(b + "attn_v.weight", o.n_embd, kv_dim);
        mat(b + "attn_output.weight", o.n_embd, o.n_embd);
        norm(b + "ffn_norm.weight");
        mat(b + "ffn_gate.weight", o.n_embd, o.n_ff);
        mat(b + "ffn_up.weight", o.n_embd, o.n_ff);
        mat(b + "ffn_down.weight", o.n_ff, o.n_embd);
    }
    uint64_t cursor = 0;
    for (auto& t : p) {
        t.offset = cursor;
        cursor += t.ne1 * row_bytes(t.type, t.ne0);
        cursor += (k_alignment - cursor % k_alignment) % k_alignment;
    }
    return p;
}

// Metadata: geometry, provenance and the vocab. Returns n_vocab through `n_vocab_out`.
status set_metadata(const synth_options& o, gguf_writer& w, uint32_t& n_vocab_out) {
    w.set_string("general.architecture", "llama");
    w.set_string("general.name", "ordo synthetic " + std::string(type_name(o.type)));
    w.set_u32("general.file_type", file_type_of(o.type));
    w.set_alignment(k_alignment);
    w.set_u32("llama.context_length", o.n_ctx);
    w.set_u32("llama.embedding_length", o.n_embd);
    w.set_u32("llama.block_count", o.n_layer);
    w.set_u32("llama.feed_forward_length", o.n_ff);
    w.set_u32("llama.attention.head_count", o.n_head);
    w.set_u32("llama.attention.head_count_kv", o.n_head_kv ? o.n_head_kv : o.n_head);
    w.set_u32("llama.rope.dimension_count", o.n_embd / o.n_head);
    w.set_f32("llama.rope.freq_base", o.rope_freq_base);
    if (o.rope_linear > 0.0f) {
        w.set_string("llama.rope.scaling.type", "linear");
        w.set_f32("llama.rope.scaling.factor", o.rope_linear);
    }
    w.set_f32("llama.attention.layer_norm_rms_epsilon", k_llama_default_rms_eps);
    w.set_u64("ordo.synth.seed", o.seed);
    if (o.vocab_from.empty()) {
        const synth_vocab v = make_byte_vocab(o.n_vocab);
        w.set_string("tokenizer.ggml.model", "llama");
        w.set_string_array("tokenizer.ggml.tokens", v.pieces);
        w.set_f32_array("tokenizer.ggml.scores", v.scores);
        w.set_i32_array("tokenizer.ggml.token_type", v.types);
        w.set_u32("tokenizer.ggml.unknown_token_id", 0);
        w.set_u32("tokenizer.ggml.bos_token_id", 1);
        w.set_u32("tokenizer.ggml.eos_token_id", 2);
        w.set_bool("tokenizer.ggml.add_bos_token", true);
        w.set_bool("tokenizer.ggml.add_eos_token", false);
        n_vocab_out = static_cast<uint32_t>(v.pieces.size());
    } else {
        auto src = gguf_file::open(o.vocab_from);
        if (!src) return src.err();
        auto tokens = src->get_array("tokenizer.ggml.tokens");
        if (!tokens) {
            return bad_options(o.vocab_from +
                               " has no usable tokenizer.ggml.tokens: " + tokens.err().message);
        }
        const size_t n = (*tokens)->items.size();
        if (n < 3 || n > k_llama_n_vocab_max) {
            return bad_options(o.vocab_from + " has " + std::to_string(n) + " tokens");
        }
        for (const auto& kv : src->metadata()) {
            if (kv.key.starts_with("tokenizer.")) w.set(kv.key, kv.value);
        }
        n_vocab_out = static_cast<uint32_t>(n);
    }
    w.set_u32("llama.vocab_size", n_vocab_out);
    return {};
}

// Buffered append-only file writer; the temporary file is removed unless commit() succeeds.
class stream_file {
public:
    explicit stream_file(std::string path)
        : _path(std::move(path)), _tmp(_path + ".tmp." + std::to_string(::getpid())) {}
    ~stream_file() {
        if (_fd >= 0) ::close(_fd);
        if (!_committed) ::unlink(_tmp.c_str());
    }

    status open() {
        _fd = ::open(_tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (_fd < 0) return io_error("cannot create " + _tmp);
        _buf.reserve(k_write_buffer_bytes);
        return {};
    }
    status append(const uint8_t* p, size_t n) {
        _written += n;
        while (n > 0) {
            const size_t take = std::min(n, k_write_buffer_bytes - _buf.size());
            _buf.insert(_buf.end(), p, p + take);
            p += take;
            n -= take;
            if (_buf.size() == k_write_buffer_bytes) {
                if (auto st = flush(); !st) return st;
            }
        }
        return {};
    }
    status pad_to(uint64_t pos) {
        static const uint8_t zeros[k_alignment] = {};
        while (_written < pos) {
            if (auto st = append(zeros, std::min<uint64_t>(pos - _written, k_alignment)); !st) {
                return st;
            }
        }
        return {};
    }
    uint64_t written() const { return _written; }

    status commit() {
        if (auto st = flush(); !st) return st;
        if (::fsync(_fd) != 0) return io_error("cannot fsync " + _tmp);
        const int rc = ::close(_fd);
        _fd = -1;
        if (rc != 0) return io_error("cannot close " + _tmp);
        if (::rename(_tmp.c_str(), _path.c_str()) != 0)
            return io_error("cannot rename to " + _path);
        _committed = true;
        return {};
    }

private:
    status flush() {
        size_t done = 0;
        while (done < _buf.size()) {
            const ssize_t n = ::write(_fd, _buf.data() + done, _buf.size() - done);
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) return io_error("cannot write " + _tmp);
            done += static_cast<size_t>(n);
        }
        _buf.clear();
        return {};
    }
    static error io_error(const std::string& what) {
        return make_error("synth_io", what + ": " + std::strerror(errno));
    }

    std::string _path;
    std::string _tmp;
    int _fd = -1;
    bool _committed = false;
    uint64_t _written = 0;
    std::vector<uint8_t> _buf;
};

// Generates and encodes one tensor row by row.
status write_tensor(stream_file& out, const planned_tensor& t, uint64_t seed) {
    std::vector<float> row(t.ne0);
    std::vector<uint8_t> encoded(row_bytes(t.type, t.ne0));
    const float scale = 1.0f / std::sqrt(static_cast<float>(t.ne0));
    for (uint64_t r = 0; r < t.ne1; ++r) {
        if (!t.values.empty()) {
            row = t.values;
        } else if (t.is_vector) {
            std::fill(row.begin(), row.end(), 1.0f);  // norm weights
        } else {
            synth_values(seed, t.name, scale, r * t.ne0, row.data(), row.size());
        }
        if (auto st = quantize_row(t.type, row.data(), encoded.data(), t.ne0); !st) return st;
        if (auto st = out.append(encoded.data(), encoded.size()); !st) return st;
    }
    return {};
}

}  // namespace

status write_synth_model(const synth_options& opt, const std::string& path) {
    if (auto st = validate_synth_options(opt); !st) return st;
    gguf_writer w;
    uint32_t n_vocab = 0;
    if (auto st = set_metadata(opt, w, n_vocab); !st) return st;
    const std::vector<planned_tensor> plan = plan_tensors(opt, n_vocab);
    for (const auto& t : plan) {
        gguf_tensor_spec spec;
        spec.name = t.name;
        spec.type_raw = static_cast<uint32_t>(t.type);
        spec.ne = t.is_vector ? std::vector<uint64_t>{t.ne0} : std::vector<uint64_t>{t.ne0, t.ne1};
        spec.offset_raw = t.offset;  // data is streamed below, not held by the writer
        w.add_tensor_raw(std::move(spec));
    }
    gguf_layout layout;
    const std::vector<uint8_t> header = w.to_bytes(&layout);
    assert(layout.data_offset == header.size() && header.size() % k_alignment == 0);

    stream_file out(path);
    if (auto st = out.open(); !st) return st;
    if (auto st = out.append(header.data(), header.size()); !st) return st;
    for (const auto& t : plan) {
        if (auto st = out.pad_to(layout.data_offset + t.offset); !st) return st;
        if (auto st = write_tensor(out, t, opt.seed); !st) return st;
    }
    const uint64_t end = out.written();
    if (auto st = out.pad_to(end + (k_alignment - end % k_alignment) % k_alignment); !st) {
        return st;
    }
    return out.commit();
}

}  // namespace ordo::model
