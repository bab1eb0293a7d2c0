// test_kv_failure.cpp: the closed sets a kv save's or restore's failure is made of
// (kv/kv_failure.hpp). kv_failure's values are four sets in a row, each keeping its own table;
// the tests check that a value of each set maps to the name its own table spells (the stats
// op's kv_disk.errors keys and the quarantine file names depend on it), that every name of the
// joined table is distinct and reads back to its value (enum_from_name is unambiguous), and the
// two gpu_failure decisions the gpu actor takes from the enum: a code no table names is a
// device error, so the device is rebuilt; a refused step or copy leaves it trusted; a build
// that does not fit the device is not tried again.
#include <gtest/gtest.h>

#include <cstddef>
#include <set>
#include <string_view>

#include "kv/kv_failure.hpp"

namespace {

using ordo::enum_count;
using ordo::enum_from_name;
using ordo::enum_name;
using ordo::actors::delivery_outcome;
using ordo::gpu::gpu_failure;
using ordo::kv::kv_error;
using ordo::kv::kv_failure;
using ordo::kv::kv_failure_of;

TEST(kv_failure, each_set_keeps_its_own_names) {
    EXPECT_EQ(enum_name(kv_failure::none), "");
    EXPECT_EQ(enum_name(kv_failure::exists), "kv_exists");
    EXPECT_EQ(enum_name(kv_failure::undelivered), "undelivered");
    for (std::size_t i = 0; i < enum_count<kv_error>; ++i) {
        const auto e = static_cast<kv_error>(i);
        EXPECT_EQ(enum_name(kv_failure_of(e)), enum_name(e));
    }
    for (std::size_t i = 0; i < enum_count<gpu_failure>; ++i) {
        const auto f = static_cast<gpu_failure>(i);
        EXPECT_EQ(enum_name(kv_failure_of(f)), enum_name(f));
    }
    for (std::size_t i = 0; i < enum_count<delivery_outcome>; ++i) {
        const auto o = static_cast<delivery_outcome>(i);
        EXPECT_EQ(enum_name(kv_failure_of(o)), enum_name(o));
    }
    EXPECT_EQ(enum_name(kv_failure_of(kv_error::block_checksum)), "kv_block_checksum");
    EXPECT_EQ(enum_name(kv_failure_of(gpu_failure::stale_epoch)), "gpu_stale_epoch");
    EXPECT_EQ(enum_name(kv_failure_of(delivery_outcome::delivery_timeout)), "delivery_timeout");
}

TEST(kv_failure, every_name_is_distinct_and_reads_back) {
    std::set<std::string_view> seen;
    for (std::size_t i = 0; i < enum_count<kv_failure>; ++i) {
        const auto f = static_cast<kv_failure>(i);
        EXPECT_TRUE(seen.insert(enum_name(f)).second) << enum_name(f) << " twice";
        EXPECT_EQ(enum_from_name<kv_failure>(enum_name(f)), f) << enum_name(f);
    }
    EXPECT_EQ(enum_count<kv_failure>, enum_count<kv_error> + enum_count<gpu_failure> +
                                          enum_count<delivery_outcome> +
                                          static_cast<std::size_t>(kv_failure::undelivered) + 1);
}

TEST(gpu_failure, a_code_is_read_once_and_decides) {
    EXPECT_EQ(ordo::gpu::gpu_failure_of({"gpu_timeout", ""}), gpu_failure::timeout);
    EXPECT_EQ(ordo::gpu::gpu_failure_of({"vulkan_error", ""}), gpu_failure::device_error);
    EXPECT_EQ(ordo::gpu::gpu_failure_of({"no_such_code", ""}), gpu_failure::device_error);
    const auto made = ordo::gpu::gpu_error(gpu_failure::busy, "full");
    EXPECT_EQ(made.code, "gpu_busy");
    EXPECT_EQ(ordo::gpu::gpu_failure_of(made), gpu_failure::busy);

    for (gpu_failure refused :
         {gpu_failure::bad_step, gpu_failure::busy, gpu_failure::bad_request}) {
        EXPECT_FALSE(ordo::gpu::device_fault(refused)) << enum_name(refused);
    }
    for (gpu_failure lost : {gpu_failure::device_error, gpu_failure::timeout,
                             gpu_failure::device_lost, gpu_failure::out_of_memory}) {
        EXPECT_TRUE(ordo::gpu::device_fault(lost)) << enum_name(lost);
        EXPECT_TRUE(ordo::gpu::build_retryable(lost)) << enum_name(lost);
    }
    for (gpu_failure permanent :
         {gpu_failure::bad_config, gpu_failure::bad_shape, gpu_failure::unsupported,
          gpu_failure::unsupported_type, gpu_failure::device_not_found}) {
        EXPECT_FALSE(ordo::gpu::build_retryable(permanent)) << enum_name(permanent);
    }
}

}  // namespace
