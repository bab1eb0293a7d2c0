// chat.hpp: `ordo chat`, an interactive conversation in the terminal (see chat.cpp).
#pragma once

#include "tools/client/cli.hpp"
#include "tools/client/connection.hpp"

namespace ordo::client {

// Runs `ordo chat [flags]` (o.args[0] == "chat") on an open connection until EOF or /exit;
// returns the process's exit code.
int run_chat(connection& c, const options& o);

}  // namespace ordo::client
