// read_pauses.hpp: the net_stop_reading pauses of one front door's connections (the net actor's,
// the HTTP actor's): until when each connection is not read, and the one timer that ends them.
// Runs on its owner's loop; knows connections only by id. The owner stops reading a connection
// it pauses, asks paused() before reading again, and restarts reading in the resume callback;
// neither door's read timeouts run while a connection is paused (the server is not reading).
#pragma once

#include <uv.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <unordered_map>

namespace ordo::door {

class read_pauses {
public:
    using clock = std::chrono::steady_clock;
    // A pause of connection `id` ended (it is no longer paused()).
    using resume_fn = std::function<void(uint64_t id, clock::time_point now)>;

    // Before any pause: the loop the timer runs on, and what ends a pause.
    void init(uv_loop_t* loop, resume_fn on_resume);
    // Pauses `id` until `until`; a second pause extends the first, never shortens it.
    void pause(uint64_t id, clock::time_point until);
    bool paused(uint64_t id) const { return _until.count(id) != 0; }
    // The connection is closed: its pause, if any, ends with no resume.
    void forget(uint64_t id) { _until.erase(id); }
    // At stop: closes the timer (once init ran); no resume runs after it.
    void close();

private:
    static void timer_cb(uv_timer_t* t);
    void resume_due();
    void arm();

    uv_timer_t _timer{};
    bool _initialised = false;
    resume_fn _on_resume;
    // One entry per paused connection: bounded by the owner's connections.
    std::unordered_map<uint64_t, clock::time_point> _until;
};

}  // namespace ordo::door
