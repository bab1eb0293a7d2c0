// pipeline_cache.hpp: the Vulkan pipeline cache ordo keeps on disk between starts
// (gpu.pipeline_cache_dir), so that a second start does not compile every pipeline again.
//
// Owned by the runner, next to its device; pipelines::build passes handle() to every
// vkCreateComputePipelines. Runs on whichever thread builds the runner (the gpu actor's worker);
// touches only its own file. Nothing here is needed for correctness: a cache that cannot be read
// is ignored and one that cannot be written is logged, and the server serves either way.
//
// ---- Why ordo wraps the driver's blob ---------------------------------------------------------
// A driver's cache blob starts with a header (vendor, device, pipelineCacheUUID) that the driver
// checks itself, but a driver is allowed to trust the rest of it, and a file cut short by a crash
// or written by another ordo build must never reach it. So the blob is wrapped:
//
//   offset  bytes  field
//        0      8  magic "ORDOPLC1"
//        8      4  format (pipeline_cache_format)
//       12      4  vendor_id        (VkPhysicalDeviceProperties)
//       16      4  device_id
//       20      4  driver_version
//       24     16  pipeline_cache_uuid
//       40      8  build_id         (shader_build_id(): every embedded SPIR-V module, hashed)
//       48      8  data_bytes
//       56      8  XXH3-64 of the data
//       64      8  XXH3-64 of bytes 0..63
//       72      -  data (the driver's blob, data_bytes long)
//
// all little-endian. A file whose identity differs from this device, driver and ordo build, or
// whose sizes or checksums do not hold, is ignored (the reason is logged) and replaced at the
// next save. Saves are atomic (a temporary file in the same folder, fsync, rename), so two
// servers sharing the folder each leave a whole file and the last rename wins.
#pragma once

#include <vulkan/vulkan.h>

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "actors/runtime/result.hpp"

namespace ordo::gpu {

class device;

inline constexpr std::uint32_t pipeline_cache_format = 1;
inline constexpr std::size_t pipeline_cache_header_bytes = 72;
// A cache file larger than this is not read (a driver's blob for ordo's ~150 pipelines is a
// few MiB; more means the file is not ours).
inline constexpr std::uint64_t pipeline_cache_bytes_max = std::uint64_t{256} << 20;

// What a cache file must have been written for.
struct pipeline_cache_identity {
    std::uint32_t vendor_id = 0;
    std::uint32_t device_id = 0;
    std::uint32_t driver_version = 0;
    std::array<std::uint8_t, 16> cache_uuid{};
    std::uint64_t build_id = 0;
    bool operator==(const pipeline_cache_identity&) const = default;
};

// The file's bytes: header and data.
std::vector<std::uint8_t> encode_pipeline_cache(const pipeline_cache_identity& id,
                                                std::span<const std::uint8_t> data);
// The data of a file written for `expect`. Error gpu_cache_invalid, naming the first thing that
// does not hold (magic, format, checksum, size, or which part of the identity differs).
result<std::span<const std::uint8_t>> decode_pipeline_cache(std::span<const std::uint8_t> file,
                                                            const pipeline_cache_identity& expect);
// "pipelines-10de-2330.bin": one file per vendor and device in the folder.
std::string pipeline_cache_file_name(const pipeline_cache_identity& id);

class pipeline_cache {
public:
    // Creates the VkPipelineCache, seeded from `dir`'s file when it is valid for `dev` and
    // `build_id`. `dir` empty: an in-memory cache, nothing read or written. Errors: only
    // vkCreatePipelineCache's (a bad or unreadable file is a note, not an error).
    static result<std::unique_ptr<pipeline_cache>> open(const device& dev, std::string dir,
                                                        std::uint64_t build_id);
    ~pipeline_cache();
    pipeline_cache(const pipeline_cache&) = delete;
    pipeline_cache& operator=(const pipeline_cache&) = delete;

    VkPipelineCache handle() const { return _cache; }
    // Writes the cache file when the driver's blob differs from what was loaded. Errors
    // (gpu_cache_io: the folder or file cannot be written) are for the caller to log.
    status save();
    // What open() did with the file: "loaded N B", "none yet", "ignored: <why>", "off".
    const std::string& load_note() const { return _note; }
    bool loaded() const { return _loaded; }
    std::string path() const;

private:
    pipeline_cache(VkDevice d, pipeline_cache_identity id, std::string dir)
        : _device(d), _id(id), _dir(std::move(dir)) {}

    VkDevice _device;
    pipeline_cache_identity _id;
    std::string _dir;
    VkPipelineCache _cache = VK_NULL_HANDLE;
    std::vector<std::uint8_t> _loaded_data;  // the blob open() seeded the cache with
    std::string _note;
    bool _loaded = false;
};

}  // namespace ordo::gpu
