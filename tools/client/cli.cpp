// cli.cpp: see cli.hpp.
#include "tools/client/cli.hpp"

#include <csignal>
#include <cstdio>
#include <string_view>

#include "tools/client/connection.hpp"

namespace ordo::client {
namespace {

volatile std::sig_atomic_t g_interrupted = 0;

}  // namespace

msgpack::sbuffer request_builder::pack(uint64_t id, const std::string& op) const {
    msgpack::sbuffer buf;
    msgpack::packer<msgpack::sbuffer> pk(buf);
    pk.pack_map(static_cast<uint32_t>(fields.size() + 2));
    pk.pack("id"), pk.pack(id);
    pk.pack("op"), pk.pack(op);
    for (const auto& [k, v] : fields) pk.pack(k), pk.pack(v);
    return buf;
}

std::optional<msgpack::object_handle> exchange(connection& c, const msgpack::sbuffer& frame,
                                               std::chrono::milliseconds timeout) {
    if (auto st = c.send(frame); !st.ok()) {
        std::fprintf(stderr, "ordo: %s\n", st.err().message.c_str());
        return std::nullopt;
    }
    auto ev = c.recv(timeout);
    if (!ev.ok()) {
        std::fprintf(stderr, "ordo: %s\n", ev.err().message.c_str());
        return std::nullopt;
    }
    return std::move(*ev);
}

bool parse_sampling_flag(const std::vector<std::string>& a, size_t& i, request_builder& b) {
    enum class number { uint, sint, real };
    struct sampling_flag {
        std::string_view flag;
        const char* key;  // the request parameter (docs/protocol.md "generate")
        number kind;
    };
    static constexpr sampling_flag table[] = {
        {"-n", "max_tokens", number::uint},
        {"--temp", "temperature", number::real},
        {"--top-k", "top_k", number::sint},
        {"--top-p", "top_p", number::real},
        {"--min-p", "min_p", number::real},
        {"--repeat-penalty", "repeat_penalty", number::real},
        {"--presence-penalty", "presence_penalty", number::real},
        {"--frequency-penalty", "frequency_penalty", number::real},
        {"--seed", "seed", number::uint},
    };
    for (const auto& t : table) {
        if (a[i] != t.flag) continue;
        if (i + 1 >= a.size()) usage_error(a[i] + " needs a value");
        const std::string& v = a[++i];
        switch (t.kind) {
            case number::uint:
                b.add(t.key, std::stoull(v));
                break;
            case number::sint:
                b.add(t.key, std::stoll(v));
                break;
            case number::real:
                b.add(t.key, std::stod(v));
                break;
        }
        return true;
    }
    return false;
}

int report_error(const msgpack::object& ev) {
    std::fprintf(stderr, "ordo: %s: %s\n", get_str(ev, "code").c_str(),
                 get_str(ev, "message").c_str());
    return exit_server_error;
}

uint64_t event_id(const msgpack::object& ev) {
    const auto* id = find(ev, "id");
    return id != nullptr && id->type == msgpack::type::POSITIVE_INTEGER ? id->via.u64 : 0;
}

void sigint_install() {
    std::signal(SIGINT, [](int) { g_interrupted = 1; });
}

bool sigint_pending() {
    return g_interrupted != 0;
}

void sigint_clear() {
    g_interrupted = 0;
}

}  // namespace ordo::client
