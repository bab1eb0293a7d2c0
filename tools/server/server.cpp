// server.cpp: see server.hpp.
#include "tools/server/server.hpp"

#include <uv.h>

#include <csignal>

#include "actors/runtime/log.hpp"
#include "net/net_actor.hpp"

namespace ordo {
namespace {

struct main_loop {
    uv_loop_t loop{};
    uv_signal_t sigint{};
    uv_signal_t sigterm{};
    std::function<void()> on_stop;
    bool stopping = false;
};

void begin_stop(main_loop& m) {
    if (m.stopping) return;
    m.stopping = true;
    m.on_stop();
    uv_close(reinterpret_cast<uv_handle_t*>(&m.sigint), nullptr);
    uv_close(reinterpret_cast<uv_handle_t*>(&m.sigterm), nullptr);
}

void signal_cb(uv_signal_t* handle, int signum) {
    auto& m = *static_cast<main_loop*>(handle->data);
    logger("main")->info("received {}, stopping", signum == SIGINT ? "SIGINT" : "SIGTERM");
    begin_stop(m);
}

net::net_options net_options_from(const config::config& cfg, const config::listen_address& a) {
    net::net_options o;
    o.host = a.host;
    o.port = a.port;
    o.connections_max = cfg.server.max_connections;
    o.frame_bytes_max = cfg.server.max_frame_bytes;
    o.inflight_per_connection_max = cfg.server.max_inflight_per_connection;
    o.write_buffer_bytes_max = cfg.server.write_buffer_bytes_max;
    return o;
}

}  // namespace

status run_server(const config::config& cfg, const server_hooks& hooks) {
    auto log = logger("main");
    auto address = config::parse_listen_address(cfg.server.listen);
    if (!address.ok()) return address.err();

    // Signal watchers first: a SIGTERM that arrives while the actors start must take the
    // orderly path, not the default action.
    main_loop m;
    uv_loop_init(&m.loop);
    uv_signal_init(&m.loop, &m.sigint);
    uv_signal_init(&m.loop, &m.sigterm);
    m.sigint.data = m.sigterm.data = &m;
    uv_signal_start(&m.sigint, signal_cb, SIGINT);
    uv_signal_start(&m.sigterm, signal_cb, SIGTERM);

    net::net_actor net(net_options_from(cfg, *address), cfg.server.mailbox_capacity);
    status started = net.start();
    if (started.ok() && !net.listen_status().ok()) {
        net.request_stop();
        (void)net.join();
        started = net.listen_status();
    }
    if (!started.ok()) {
        m.on_stop = [] {};
        begin_stop(m);
        uv_run(&m.loop, UV_RUN_DEFAULT);
        uv_loop_close(&m.loop);
        return started;
    }
    if (hooks.on_listening) hooks.on_listening(address->host, net.bound_port());

    status first_failure;
    m.on_stop = [&] {
        // Dependency order: the net actor first, so no new request arrives while the actors
        // behind it wind down.
        net.request_stop();
        if (auto st = net.join(); !st.ok() && first_failure.ok()) first_failure = st;
    };
    uv_run(&m.loop, UV_RUN_DEFAULT);
    int rc = uv_loop_close(&m.loop);
    if (rc != 0 && first_failure.ok()) {
        first_failure = make_error("loop_leak", std::string("main loop: ") + uv_strerror(rc));
    }
    if (first_failure.ok()) log->info("stopped cleanly");
    return first_failure;
}

}  // namespace ordo
