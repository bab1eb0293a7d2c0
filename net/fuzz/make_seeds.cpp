// make_seeds.cpp: writes a seed corpus for ordo_fuzz_frames into the directory given as argv[1]:
// a few valid request frames (alone, several in one stream, touching every header kind), and
// the known-bad streams (the str32 reproduction, 0xc1, a frame nested to the depth limit).
// Each seed starts with the fuzzer's 5 plan bytes: the max_frame_bytes choice, then the chunk
// sizes (see fuzz_frames.cpp).
#include <cstdio>
#include <fstream>
#include <msgpack.hpp>
#include <string>

namespace {

// Indexes into fuzz_frames.cpp's frame_bytes_max_choices.
constexpr char limit_64 = 6;
constexpr char limit_128 = 8;
constexpr char limit_1024 = 12;
constexpr char limit_1_mib = 15;
const std::string chunks_mixed("\x00\x02\x06\xc8", 4);  // chunks of 1, 3, 7 and 201 bytes

std::string plan(char limit) {
    return std::string(1, limit) + chunks_mixed;
}

std::string packed(void (*body)(msgpack::packer<msgpack::sbuffer>&)) {
    msgpack::sbuffer b;
    msgpack::packer<msgpack::sbuffer> pk(b);
    body(pk);
    return {b.data(), b.size()};
}

std::string health(uint64_t id) {
    msgpack::sbuffer b;
    msgpack::packer<msgpack::sbuffer> pk(b);
    pk.pack_map(2), pk.pack("id"), pk.pack(id), pk.pack("op"), pk.pack("health");
    return {b.data(), b.size()};
}

bool save(const std::string& dir, const char* name, const std::string& bytes) {
    std::ofstream f(dir + "/" + name, std::ios::binary);
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!f) std::fprintf(stderr, "cannot write %s/%s\n", dir.c_str(), name);
    return static_cast<bool>(f);
}

}  // namespace

int main(int argc, char** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: ordo_fuzz_frames_seeds DIR\n");
        return 2;
    }
    const std::string dir = argv[1];
    const std::string stats_unknown_key = packed([](auto& pk) {
        pk.pack_map(3), pk.pack("id"), pk.pack(7), pk.pack("op"), pk.pack("stats");
        pk.pack("verbose"), pk.pack(true);
    });
    const std::string generate = packed([](auto& pk) {
        pk.pack_map(5), pk.pack("id"), pk.pack(uint64_t{1} << 40), pk.pack("op");
        pk.pack("generate"), pk.pack("prompt"), pk.pack(std::string(40, 'p'));
        pk.pack("tokens"), pk.pack_array(4), pk.pack(1), pk.pack(300), pk.pack(70000);
        pk.pack(-5), pk.pack("sampling"), pk.pack_map(2), pk.pack("temperature");
        pk.pack(0.7), pk.pack("top_p"), pk.pack(0.9f);
    });
    const std::string bin_ext = packed([](auto& pk) {
        pk.pack_map(4), pk.pack("id"), pk.pack(3), pk.pack("op"), pk.pack("tokenize");
        pk.pack("bin"), pk.pack_bin(3), pk.pack_bin_body("\x00\x01\x02", 3);
        pk.pack("ext"), pk.pack_ext(4, 1), pk.pack_ext_body("abcd", 4);
    });
    const std::string chat = packed([](auto& pk) {
        pk.pack_map(6), pk.pack("id"), pk.pack(9), pk.pack("op"), pk.pack("chat");
        pk.pack("messages"), pk.pack_array(2);
        pk.pack_map(2), pk.pack("role"), pk.pack("user"), pk.pack("content"), pk.pack("Hi");
        pk.pack_map(3), pk.pack("role"), pk.pack("assistant"), pk.pack("content"), pk.pack_nil();
        pk.pack("tool_calls"), pk.pack_array(1), pk.pack_map(1), pk.pack("name"), pk.pack("f");
        pk.pack("tools"), pk.pack_array(1), pk.pack_map(1), pk.pack("name"), pk.pack("f");
        pk.pack("chat_template_kwargs"), pk.pack_map(1), pk.pack("x"), pk.pack(1.5);
        pk.pack("max_tokens"), pk.pack(4);
    });
    const std::string not_a_map =
        packed([](auto& pk) { pk.pack_array(2), pk.pack(1), pk.pack(2); });
    const std::string str32_reproduction(
        "\x82\xa2id\x01\xa2op\xdb\xff\xff\xff\xf0"
        "abc",
        16);
    const std::string reserved_c1("\x82\xa2id\x01\xa2op\xc1", 9);
    std::string deepest(32, '\x91');
    deepest += '\x01';

    bool ok = true;
    ok &= save(dir, "health", plan(limit_1024) + health(1));
    ok &= save(dir, "stats_unknown_key", plan(limit_64) + stats_unknown_key);
    ok &= save(dir, "generate", plan(limit_1024) + generate);
    ok &= save(dir, "chat", plan(limit_1024) + chat);
    ok &= save(dir, "three_frames", plan(limit_128) + health(1) + stats_unknown_key + health(2));
    ok &= save(dir, "bin_ext", plan(limit_128) + bin_ext);
    ok &= save(dir, "not_a_map", plan(limit_64) + not_a_map);
    ok &= save(dir, "str32_reproduction_1mib", plan(limit_1_mib) + str32_reproduction);
    ok &= save(dir, "str32_reproduction_64", plan(limit_64) + str32_reproduction);
    ok &= save(dir, "reserved_c1", plan(limit_64) + health(4) + reserved_c1);
    ok &= save(dir, "depth_32", plan(limit_128) + deepest);
    return ok ? 0 : 1;
}
