// read_pauses.cpp: see read_pauses.hpp.
#include "door/read_pauses.hpp"

#include <algorithm>
#include <optional>
#include <vector>

namespace ordo::door {

void read_pauses::init(uv_loop_t* loop, resume_fn on_resume) {
    uv_timer_init(loop, &_timer);
    _timer.data = this;
    _initialised = true;
    _on_resume = std::move(on_resume);
}

void read_pauses::pause(uint64_t id, clock::time_point until) {
    auto [it, fresh] = _until.try_emplace(id, until);
    if (!fresh && it->second < until) it->second = until;
    arm();
}

void read_pauses::close() {
    if (!_initialised) return;
    _initialised = false;
    _until.clear();
    uv_close(reinterpret_cast<uv_handle_t*>(&_timer), nullptr);
}

// The timer fires at the earliest end of a pause.
void read_pauses::arm() {
    std::optional<clock::time_point> first;
    for (const auto& [id, until] : _until) {
        if (!first || until < *first) first = until;
    }
    if (!first || !_initialised) return;
    auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(*first - clock::now());
    uv_timer_start(&_timer, &read_pauses::timer_cb, uint64_t(std::max<int64_t>(0, wait.count())),
                   0);
}

void read_pauses::timer_cb(uv_timer_t* t) {
    static_cast<read_pauses*>(t->data)->resume_due();
}

void read_pauses::resume_due() {
    const auto now = clock::now();
    std::vector<uint64_t> due;
    for (const auto& [id, until] : _until) {
        if (until <= now) due.push_back(id);
    }
    for (uint64_t id : due) _until.erase(id);
    for (uint64_t id : due) _on_resume(id, now);
    arm();
}

}  // namespace ordo::door
