// cmd_kv_inspect.cpp: `ordo-model kv-inspect FILE [--verify] [--json]`: what an operator wants to
// know about one persisted KV file (docs/kv-format.md) without the model that wrote it: the
// header (format, kind, model fingerprint, KV geometry, sizes) and, with --verify, whether the
// token ids and every block still match their checksums.
//
// The header comes from kv::read_kv_header_any: every check a loader makes except the comparison
// with a model. A refused header is one line naming its kv error code and message, exit 1.
// --verify reads the token ids (kv::read_kv_tokens) and the blocks (kv::read_kv_blocks) in
// chunks of at most k_verify_chunk_bytes, never fewer than one block, so a large file is checked
// in bounded memory; a chunk that fails its checksum is re-read block by block so that every
// corrupt block is named, not only the first. Exit: 0 valid (the header; with --verify every
// checksum too), 1 refused or corrupt, 2 usage.
#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <optional>

#include "kv/kv_file.hpp"
#include "tools/model/commands.hpp"

namespace ordo::tools {

namespace {

int run_kv_inspect(std::span<const std::string> argv);

const command k_kv_inspect{"kv-inspect", "kv-inspect FILE [--verify] [--json]",
                           "header of a persisted KV file; --verify checks every checksum",
                           run_kv_inspect};
const command_registrar k_kv_inspect_reg{k_kv_inspect};

// Memory for one read of blocks: large enough that a read is not dominated by reopening the file
// (read_kv_blocks re-checks the header each call), small enough for any operator's machine.
constexpr std::uint64_t k_verify_chunk_bytes = std::uint64_t{64} << 20;
// Problems printed in full; the rest are counted (a file of 2^21 bad blocks prints 16 lines).
constexpr std::size_t k_problems_listed_max = 16;

// What --verify found. The file is valid when n_problems is 0.
struct verify_result {
    bool tokens_ok = false;
    std::uint32_t blocks_checked = 0;  // blocks whose checksum was compared, good or bad
    std::uint32_t blocks_corrupt = 0;
    std::uint64_t n_problems = 0;  // all of them
    std::vector<error> problems;   // the first k_problems_listed_max, in file order
    bool stopped = false;  // an error other than a checksum (io, changed, truncated) ended it

    void add(const error& e) {
        ++n_problems;
        if (problems.size() < k_problems_listed_max) problems.push_back(e);
    }
};

bool is_code(const error& e, kv::kv_error code) {
    return kv::kv_error_of(e) == code;
}

// Blocks [first, first + n), already known to hold at least one corrupt block, one at a time.
// Returns false when verification must stop.
bool verify_each_block(const std::string& path, const kv::kv_file_header& h, std::uint32_t first,
                       std::uint32_t n, std::span<std::uint8_t> buffer, verify_result& out) {
    const std::uint64_t bb = h.meta.geometry.block_bytes();
    for (std::uint32_t b = first; b < first + n; ++b) {
        const status s = kv::read_kv_blocks(path, h, b, 1, buffer.first(bb));
        if (s) {
            ++out.blocks_checked;
            continue;
        }
        out.add(s.err());
        if (!is_code(s.err(), kv::kv_error::block_checksum)) return false;
        ++out.blocks_checked;
        ++out.blocks_corrupt;
    }
    return true;
}

void verify_blocks(const std::string& path, const kv::kv_file_header& h, verify_result& out) {
    const std::uint64_t bb = h.meta.geometry.block_bytes();
    const auto chunk_blocks = static_cast<std::uint32_t>(
        std::clamp<std::uint64_t>(k_verify_chunk_bytes / bb, 1, h.n_blocks));
    std::vector<std::uint8_t> buffer(chunk_blocks * bb);
    std::uint32_t n = 0;
    for (std::uint32_t first = 0; first < h.n_blocks; first += n) {
        n = std::min(chunk_blocks, h.n_blocks - first);
        const status s = kv::read_kv_blocks(path, h, first, n, std::span(buffer).first(n * bb));
        if (s) {
            out.blocks_checked += n;
            continue;
        }
        if (!is_code(s.err(), kv::kv_error::block_checksum)) {
            out.add(s.err());
            out.stopped = true;
            return;
        }
        // read_kv_blocks names the first corrupt block of the chunk; name all of them.
        if (!verify_each_block(path, h, first, n, buffer, out)) {
            out.stopped = true;
            return;
        }
    }
}

verify_result verify_file(const std::string& path, const kv::kv_file_header& h) {
    verify_result out;
    auto tokens = kv::read_kv_tokens(path, h);
    out.tokens_ok = tokens.ok();
    if (!tokens) {
        out.add(tokens.err());
        // Corrupt ids leave the blocks worth checking; a vanished or replaced file does not.
        if (!is_code(tokens.err(), kv::kv_error::tokens_checksum)) {
            out.stopped = true;
            return out;
        }
    }
    verify_blocks(path, h, out);
    return out;
}

// ---- output -------------------------------------------------------------------------------------

const char* kind_name(kv::kv_file_kind k) {
    return k == kv::kv_file_kind::session ? "session" : "prefix";
}
const char* dtype_name(kv::kv_file_dtype d) {
    return d == kv::kv_file_dtype::f32 ? "f32" : "f16";
}
std::string hex64(std::uint64_t v) {
    char buf[24];
    std::snprintf(buf, sizeof buf, "0x%016" PRIx64, v);
    return buf;
}

void print_header_text(const std::string& path, const kv::kv_file_header& h) {
    const kv::kv_file_geometry& g = h.meta.geometry;
    std::printf("file: %s\n", path.c_str());
    std::printf("format: version %u, header %zu bytes\n", kv::kv_format_version,
                kv::kv_header_bytes);
    std::printf("kind: %s, session_hash %s\n", kind_name(h.meta.kind),
                hex64(h.meta.session_hash).c_str());
    std::printf("fingerprint: %s\n", h.meta.fingerprint.hex().c_str());
    std::printf("geometry: n_layer %u, n_head_kv %u, head_dim %u, block_tokens %u, dtype %s\n",
                g.n_layer, g.n_head_kv, g.head_dim, g.block_tokens, dtype_name(g.dtype));
    std::printf("size: %u blocks, %u tokens, %" PRIu64 " bytes per block, %" PRIu64
                " bytes in the file\n",
                h.n_blocks, h.n_tokens(), g.block_bytes(), h.file_bytes);
}

void print_verify_text(const kv::kv_file_header& h, const std::optional<verify_result>& v) {
    if (!v) {
        std::printf("checksums: not verified (--verify reads every block)\nresult: header ok\n");
        return;
    }
    std::printf("tokens: %s\n", v->tokens_ok ? "ok" : "corrupt");
    for (const error& e : v->problems) {
        std::printf("problem: %s: %s\n", e.code.c_str(), e.message.c_str());
    }
    if (v->n_problems > v->problems.size()) {
        std::printf("problem: ... %" PRIu64 " more\n", v->n_problems - v->problems.size());
    }
    std::printf("blocks: %u of %u checked, %u corrupt%s\n", v->blocks_checked, h.n_blocks,
                v->blocks_corrupt, v->stopped ? " (verification stopped)" : "");
    if (v->n_problems == 0) {
        std::printf("result: ok\n");
    } else {
        std::printf("result: corrupt (%s)\n", v->problems.front().code.c_str());
    }
}

std::string error_json(const error& e) {
    return "{\"code\": " + json_string(e.code) + ", \"message\": " + json_string(e.message) + "}";
}

std::string header_json(const kv::kv_file_header& h) {
    const kv::kv_file_geometry& g = h.meta.geometry;
    auto num = [](const char* k, std::uint64_t v) {
        return ", \"" + std::string(k) + "\": " + std::to_string(v);
    };
    return "{\"version\": " + std::to_string(kv::kv_format_version) +
           ", \"kind\": " + json_string(kind_name(h.meta.kind)) +
           ", \"session_hash\": " + json_string(hex64(h.meta.session_hash)) +
           ", \"fingerprint\": " + json_string(h.meta.fingerprint.hex()) +
           num("n_layer", g.n_layer) + num("n_head_kv", g.n_head_kv) + num("head_dim", g.head_dim) +
           num("block_tokens", g.block_tokens) +
           ", \"dtype\": " + json_string(dtype_name(g.dtype)) + num("n_blocks", h.n_blocks) +
           num("n_tokens", h.n_tokens()) + num("block_bytes", g.block_bytes()) +
           num("file_bytes", h.file_bytes) + "}";
}

void print_json(const std::string& path, const kv::kv_file_header& h,
                const std::optional<verify_result>& v) {
    std::string out =
        "{\"file\": " + json_string(path) + ", \"ok\": " + (v && v->n_problems ? "false" : "true") +
        ", \"header\": " + header_json(h) + ", \"verified\": " + (v ? "true" : "false");
    if (v) {
        out += ", \"tokens_ok\": " + std::string(v->tokens_ok ? "true" : "false") +
               ", \"blocks_checked\": " + std::to_string(v->blocks_checked) +
               ", \"blocks_corrupt\": " + std::to_string(v->blocks_corrupt) +
               ", \"stopped\": " + (v->stopped ? "true" : "false") +
               ", \"n_problems\": " + std::to_string(v->n_problems) + ", \"problems\": [";
        for (std::size_t i = 0; i < v->problems.size(); ++i) {
            out += (i ? ", " : "") + error_json(v->problems[i]);
        }
        out += "]";
    }
    std::printf("%s}\n", out.c_str());
}

int run_kv_inspect(std::span<const std::string> argv) {
    auto args = parse_args(argv, {{}, {"verify", "json"}, 1, 1});
    if (!args) return report_error(args.err(), &k_kv_inspect);
    const std::string& path = args->positional[0];
    const bool json = args->flag("json");
    auto h = kv::read_kv_header_any(path);
    if (!h) {
        if (json) {
            std::printf("{\"file\": %s, \"ok\": false, \"error\": %s}\n", json_string(path).c_str(),
                        error_json(h.err()).c_str());
            return k_exit_failed;
        }
        return report_error(h.err());
    }
    std::optional<verify_result> v;
    if (args->flag("verify")) v = verify_file(path, *h);
    if (json) {
        print_json(path, *h, v);
    } else {
        print_header_text(path, *h);
        print_verify_text(*h, v);
    }
    return v && v->n_problems > 0 ? k_exit_failed : k_exit_ok;
}

}  // namespace

}  // namespace ordo::tools
