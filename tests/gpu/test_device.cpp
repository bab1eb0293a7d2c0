// test_device.cpp: device choice from the `gpu.device` string. The pure policy is checked on
// synthetic device lists ("" and "auto" prefer discrete > integrated > virtual > cpu; digits
// are an index; anything else a case-insensitive substring; no match or a bad index is an error
// that lists every device). On the real machine: a bad name or index fails with the device
// list, the lavapipe name selects it, and the reported info (limits, heaps) is filled in; and
// the memory type a buffer takes: kernel buffers host-visible device-local only where that heap
// is the whole device memory (lavapipe, resizable BAR), not a discrete GPU's 256 MiB window;
// fill_zero (vkCmdFillBuffer, the KV pool's clearing) zeroes every byte of a buffer, the 1-3
// bytes past its last whole word included, and nothing of another buffer.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "gpu/vk/device_select.hpp"
#include "gpu_fixture.hpp"

namespace ordo::gpu::testing {
namespace {

const std::vector<device_candidate> devices = {
    {"llvmpipe (LLVM 15.0.6, 256 bits)", device_kind::cpu},
    {"Intel(R) UHD Graphics 630", device_kind::integrated},
    {"NVIDIA GeForce RTX 4090", device_kind::discrete},
};

TEST(DeviceSelect, AutoPrefersDiscreteThenIntegratedThenAny) {
    EXPECT_EQ(*select_device(devices, ""), 2u);
    EXPECT_EQ(*select_device({devices[0], devices[1]}, ""), 1u);
    EXPECT_EQ(*select_device({devices[0]}, ""), 0u);
    // "auto" is the documented spelling of the default (etc/ordo.toml), not a name to match.
    EXPECT_EQ(*select_device(devices, "auto"), 2u);
    EXPECT_EQ(*select_device({devices[0], devices[1]}, "AUTO"), 1u);
}

TEST(DeviceSelect, IndexAndCaseInsensitiveName) {
    EXPECT_EQ(*select_device(devices, "1"), 1u);
    EXPECT_EQ(*select_device(devices, "nvidia"), 2u);
    EXPECT_EQ(*select_device(devices, "LLVMPIPE"), 0u);
}

TEST(DeviceSelect, NoMatchAndBadIndexListDevices) {
    auto none = select_device(devices, "radeon");
    ASSERT_FALSE(none.ok());
    EXPECT_EQ(none.err().code, "gpu_device_not_found");
    EXPECT_NE(none.err().message.find("2: NVIDIA GeForce RTX 4090 (discrete)"), std::string::npos)
        << none.err().message;
    auto far = select_device(devices, "3");
    ASSERT_FALSE(far.ok());
    EXPECT_NE(far.err().message.find("out of range"), std::string::npos);
    EXPECT_NE(far.err().message.find("0: llvmpipe"), std::string::npos);
    EXPECT_FALSE(select_device({}, "").ok());
}

constexpr std::uint32_t DL = memory_facts::device_local, HV = memory_facts::host_visible,
                        HC = memory_facts::host_coherent, CA = memory_facts::host_cached;
constexpr std::uint64_t MiB = std::uint64_t{1} << 20, GiB = std::uint64_t{1} << 30;

TEST(DeviceSelect, KernelBuffersTakeHostVisibleDeviceMemoryOnlyWhereItIsAllOfIt) {
    // lavapipe: one heap, host-visible and device-local.
    const memory_facts cpu{{{DL | HV | HC | CA, 0}}, {{2 * GiB, true}}};
    EXPECT_EQ(choose_memory_type(cpu, 0x1, true), 0);
    EXPECT_EQ(choose_memory_type(cpu, 0x1, false), 0);
    // A discrete GPU without resizable BAR: its memory, the host's, and a 256 MiB window of its
    // memory that the host sees. Weights and KV never go to the window.
    const memory_facts window{{{DL, 0}, {HV | HC, 1}, {HV | HC | CA, 1}, {DL | HV | HC, 2}},
                              {{24 * GiB, true}, {64 * GiB, false}, {256 * MiB, true}}};
    EXPECT_EQ(choose_memory_type(window, 0xF, true), 0);
    EXPECT_EQ(choose_memory_type(window, 0xF, false), 2);  // host-visible, cached
    EXPECT_EQ(choose_memory_type(window, 0xB, false), 1);  // not cached where none is allowed
    EXPECT_EQ(choose_memory_type(window, 0xE, true), 3);   // the window, when it is all allowed
    // With resizable BAR the device's whole memory is host-visible: uploads skip staging.
    const memory_facts rebar{{{DL, 0}, {DL | HV | HC, 0}, {HV | HC | CA, 1}},
                             {{24 * GiB, true}, {64 * GiB, false}}};
    EXPECT_EQ(choose_memory_type(rebar, 0x7, true), 1);
    // Nothing device-local allowed: any allowed type; nothing allowed: none.
    EXPECT_EQ(choose_memory_type(window, 0x4, true), 2);
    EXPECT_EQ(choose_memory_type(window, 0x0, true), -1);
}

TEST(DeviceReal, BadNameAndIndexAreErrorsListingDevices) {
    ORDO_REQUIRE_GPU();
    auto bad = device::create({"no-such-gpu-anywhere"});
    ASSERT_FALSE(bad.ok());
    EXPECT_EQ(bad.err().code, "gpu_device_not_found");
    EXPECT_NE(bad.err().message.find(env().dev->info().name), std::string::npos)
        << bad.err().message;
    auto far = device::create({"99"});
    ASSERT_FALSE(far.ok());
    EXPECT_NE(far.err().message.find("out of range"), std::string::npos);
}

TEST(DeviceReal, SelectByNameAndReportInfo) {
    ORDO_REQUIRE_GPU();
    const device_info& info = env().dev->info();
    std::string needle = info.name.substr(0, 4);
    for (char& c : needle) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    auto again = device::create({needle});
    ASSERT_TRUE(again.ok()) << again.err().message;
    EXPECT_EQ((*again)->info().name, info.name);
    EXPECT_GT(info.max_storage_buffer_range, 0u);
    EXPECT_GT(info.max_shared_memory_bytes, 0u);
    EXPECT_GT(info.subgroup_size, 0u);
    EXPECT_GT(info.max_workgroup_invocations, 0u);
    EXPECT_GT(info.max_workgroup_count[0], 0u);
    EXPECT_FALSE(info.heaps.empty());
    EXPECT_FALSE(info.api_version.empty());
    std::string text = describe(info);
    EXPECT_NE(text.find("subgroup"), std::string::npos);
}

TEST(DeviceReal, FillZeroClearsEveryByteAndNoOtherBuffer) {
    ORDO_REQUIRE_GPU();
    device& dev = *env().dev;
    for (memory_use use : {memory_use::device, memory_use::host_readback}) {
        // A word, a tail of 3 bytes past 1 word, and more than a staging copy's 64 MiB (what a
        // write moves per submission) with a tail.
        for (std::uint64_t size :
             {std::uint64_t{4}, std::uint64_t{7}, (std::uint64_t{64} << 20) + 3}) {
            auto b = dev.create_buffer(size, use);
            auto other = dev.create_buffer(size, use);
            ASSERT_TRUE(b.ok() && other.ok());
            const std::vector<std::uint8_t> ones(size, 0xAB);
            ASSERT_TRUE(dev.write(*b, 0, ones.data(), size).ok());
            ASSERT_TRUE(dev.write(*other, 0, ones.data(), size).ok());
            ASSERT_TRUE(dev.fill_zero(*b).ok());
            std::vector<std::uint8_t> got(size, 0xFF);
            ASSERT_TRUE(dev.read(*b, 0, got.data(), size).ok());
            EXPECT_EQ(std::count(got.begin(), got.end(), 0), std::ptrdiff_t(size)) << size;
            ASSERT_TRUE(dev.read(*other, 0, got.data(), size).ok());
            EXPECT_EQ(got, ones) << size;
        }
    }
}

}  // namespace
}  // namespace ordo::gpu::testing
