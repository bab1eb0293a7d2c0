// server.hpp: the running service: every actor of one ordo-server process, started in
// dependency order (the scheduler before the doors that forward to it). A stop first drains
// (the doors stop accepting, running requests get shutdown_grace_ms), then stops the scheduler
// (every live request gets its terminal event while the doors can still write it), the kv
// actor (its saves in flight, within kv.flush_ms_max), the doors (they flush and close) and
// the gpu actor last (it waits out its running step): server.cpp's stop_actors.
//
// Owned by main's thread. It reacts to SIGINT/SIGTERM on a small libuv loop of its own, so a
// signal is an ordinary event there, never work done inside a signal handler.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "actors/config/config.hpp"
#include "actors/runtime/result.hpp"
#include "door/api_keys.hpp"
#include "tools/server/model_load.hpp"

namespace ordo {

struct server_hooks {
    // Called once listening succeeded, with the host and the bound port (tests use port 0).
    std::function<void(const std::string& host, uint16_t port)> on_listening;
    // Called before on_listening when the HTTP front door listens (http.listen not empty).
    std::function<void(const std::string& host, uint16_t port)> on_http_listening;
};

// Serves `model` (already loaded and checked by load_model; it must outlive the call) until
// SIGINT/SIGTERM. Returns the first failure: an actor that could not start, or a loop that did
// not close cleanly. Everything that can never run (bad config, unusable model) was refused
// before this is called, so a failure here is a runtime one (main exits 1 on it, not 2).
// `keys`: the API keys both front doors require (none: both are open, and a non-loopback
// listen address is warned about).
// `draft`: the draft model (load_draft_model) when speculative.mode = "draft", else null; it
// too must outlive the call.
status run_server(const config::config& cfg, const loaded_model& model, const loaded_model* draft,
                  const server_hooks& hooks, const door::api_keys& keys);

}  // namespace ordo
