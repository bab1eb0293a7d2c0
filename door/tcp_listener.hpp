// tcp_listener.hpp: the listening socket of a front door (the net actor's msgpack port, the
// HTTP actor's port): bind, listen, the port actually bound (port 0 = ephemeral), close. One
// place for what both doors did alike; accepting is the front door's (door/front_door.hpp).
#pragma once

#include <uv.h>

#include <cstdint>
#include <string>
#include <string_view>

#include "actors/runtime/result.hpp"

namespace ordo::door {

class tcp_listener {
public:
    // Binds host:port on `loop` and listens; `cb` gets the listener's stream, whose `data` is
    // `data`. `door` names the front door in error messages ("" for the msgpack port, "http").
    // Error: listen_failed naming the address. After any call the handle needs close().
    status open(uv_loop_t* loop, const std::string& host, uint16_t port, void* data,
                uv_connection_cb cb, std::string_view door);
    // Closes the handle once (no-op when not opened or already closed).
    void close();
    uv_stream_t* stream() { return reinterpret_cast<uv_stream_t*>(&_tcp); }
    uint16_t port() const { return _port; }  // the bound port, once open succeeded

private:
    uv_tcp_t _tcp{};
    bool _initialised = false;
    uint16_t _port = 0;
};

}  // namespace ordo::door
