// scenarios.hpp: the named scenarios of ordo-fault (the field failures F1, F2, F4, F5, F7 of
// ARCHITECTURE.md, reproduced as reported, and a table of fault kind x phase x batch size x
// cancel timing). Each runs against real ordo-server processes and reports violations of the
// invariants listed in harness.hpp's file comment.
#pragma once

#include <string>
#include <vector>

#include "tools/fault/harness.hpp"

namespace ordo::fault {

struct scenario_result {
    std::string name;
    findings found;
    double seconds = 0;
};

// Names of every scenario, in the order `all` runs them.
std::vector<std::string> scenario_names();
// Runs the named scenarios (all of them for {"all"}); unknown names are a usage error the
// caller reports before calling this.
std::vector<scenario_result> run_scenarios(const context& ctx,
                                           const std::vector<std::string>& names);

}  // namespace ordo::fault
