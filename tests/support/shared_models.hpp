// shared_models.hpp: the one guard for tests that need the real test models in ../shared/models.
//
// Without that folder (a fresh clone alone) such a test skips with a visible message. With
// ORDO_MODELS_REQUIRED=1 in the environment (.ci/run sets it: CI always has ../shared) a missing
// file fails the test instead, so a misplaced folder cannot pass CI as a run of skips.
#pragma once

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>

namespace ordo::test {

inline bool shared_models_required() {
    const char* v = std::getenv("ORDO_MODELS_REQUIRED");
    return v != nullptr && std::string_view(v) == "1";
}

}  // namespace ordo::test

// Use at the top of a test (or SetUp): returns from it, failed or skipped, when `path` is absent.
#define ORDO_REQUIRE_SHARED(path)                                                             \
    do {                                                                                      \
        const std::string ordo_path_ = (path);                                                \
        if (!std::filesystem::exists(ordo_path_)) {                                           \
            if (::ordo::test::shared_models_required()) {                                     \
                GTEST_FAIL() << "ORDO_MODELS_REQUIRED=1 but " << ordo_path_ << " is missing"; \
            }                                                                                 \
            std::fprintf(stderr,                                                              \
                         "\n*** SKIPPING: %s is absent (../shared/models is not beside "      \
                         "this checkout) ***\n\n",                                            \
                         ordo_path_.c_str());                                                 \
            GTEST_SKIP() << "shared test model missing: " << ordo_path_;                      \
        }                                                                                     \
    } while (0)
