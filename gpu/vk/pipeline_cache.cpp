// pipeline_cache.cpp: see pipeline_cache.hpp.
#include "gpu/vk/pipeline_cache.hpp"

#include <xxhash.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "actors/runtime/atomic_file.hpp"
#include "gpu/vk/device.hpp"
#include "gpu/vk/vk_util.hpp"

namespace ordo::gpu {

namespace {

constexpr char magic[8] = {'O', 'R', 'D', 'O', 'P', 'L', 'C', '1'};

void put32(std::uint8_t* p, std::uint32_t v) {
    for (int i = 0; i < 4; ++i) p[i] = static_cast<std::uint8_t>(v >> (8 * i));
}
void put64(std::uint8_t* p, std::uint64_t v) {
    for (int i = 0; i < 8; ++i) p[i] = static_cast<std::uint8_t>(v >> (8 * i));
}
std::uint32_t get32(const std::uint8_t* p) {
    std::uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= std::uint32_t(p[i]) << (8 * i);
    return v;
}
std::uint64_t get64(const std::uint8_t* p) {
    std::uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= std::uint64_t(p[i]) << (8 * i);
    return v;
}

error invalid(const std::string& why) {
    return gpu_error(gpu_failure::cache_invalid, why);
}
// The file's bytes, or an empty vector with `note` saying why there are none.
std::vector<std::uint8_t> read_file(const std::string& path, std::string& note) {
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) {
        note = "none yet";
        return {};
    }
    auto size = std::filesystem::file_size(path, ec);
    if (ec) {
        note = "ignored: " + ec.message();
        return {};
    }
    if (size > pipeline_cache_bytes_max) {
        note = "ignored: " + std::to_string(size) + " B is more than a cache file holds (" +
               std::to_string(pipeline_cache_bytes_max) + ")";
        return {};
    }
    std::ifstream in(path, std::ios::binary);
    std::vector<std::uint8_t> bytes(size);
    if (!in.read(reinterpret_cast<char*>(bytes.data()), std::streamsize(size))) {
        note = "ignored: cannot read it";
        return {};
    }
    return bytes;
}

}  // namespace

std::vector<std::uint8_t> encode_pipeline_cache(const pipeline_cache_identity& id,
                                                std::span<const std::uint8_t> data) {
    std::vector<std::uint8_t> out(pipeline_cache_header_bytes + data.size());
    std::uint8_t* h = out.data();
    std::memcpy(h, magic, sizeof magic);
    put32(h + 8, pipeline_cache_format);
    put32(h + 12, id.vendor_id);
    put32(h + 16, id.device_id);
    put32(h + 20, id.driver_version);
    std::memcpy(h + 24, id.cache_uuid.data(), id.cache_uuid.size());
    put64(h + 40, id.build_id);
    put64(h + 48, data.size());
    put64(h + 56, XXH3_64bits(data.data(), data.size()));
    put64(h + 64, XXH3_64bits(h, 64));
    if (!data.empty()) std::memcpy(h + pipeline_cache_header_bytes, data.data(), data.size());
    return out;
}

result<std::span<const std::uint8_t>> decode_pipeline_cache(std::span<const std::uint8_t> file,
                                                            const pipeline_cache_identity& expect) {
    if (file.size() < pipeline_cache_header_bytes) {
        return invalid("the file is " + std::to_string(file.size()) + " B, shorter than a header");
    }
    const std::uint8_t* h = file.data();
    if (std::memcmp(h, magic, sizeof magic) != 0) return invalid("not an ordo pipeline cache");
    if (get64(h + 64) != XXH3_64bits(h, 64)) return invalid("header checksum mismatch");
    if (get32(h + 8) != pipeline_cache_format) {
        return invalid("format " + std::to_string(get32(h + 8)) + ", this build reads " +
                       std::to_string(pipeline_cache_format));
    }
    pipeline_cache_identity got;
    got.vendor_id = get32(h + 12);
    got.device_id = get32(h + 16);
    got.driver_version = get32(h + 20);
    std::memcpy(got.cache_uuid.data(), h + 24, got.cache_uuid.size());
    got.build_id = get64(h + 40);
    if (got.vendor_id != expect.vendor_id || got.device_id != expect.device_id) {
        return invalid("written for another device");
    }
    if (got.driver_version != expect.driver_version || got.cache_uuid != expect.cache_uuid) {
        return invalid("written by another driver version");
    }
    if (got.build_id != expect.build_id) return invalid("written by another ordo build");
    const std::uint64_t data_bytes = get64(h + 48);
    if (data_bytes != file.size() - pipeline_cache_header_bytes) {
        return invalid("the header says " + std::to_string(data_bytes) +
                       " B of data, the file has " +
                       std::to_string(file.size() - pipeline_cache_header_bytes));
    }
    auto data = file.subspan(pipeline_cache_header_bytes);
    if (get64(h + 56) != XXH3_64bits(data.data(), data.size())) {
        return invalid("data checksum mismatch");
    }
    return data;
}

std::string pipeline_cache_file_name(const pipeline_cache_identity& id) {
    char name[64];
    std::snprintf(name, sizeof name, "pipelines-%04x-%04x.bin", id.vendor_id, id.device_id);
    return name;
}

std::string pipeline_cache::path() const {
    return _dir.empty() ? std::string()
                        : (std::filesystem::path(_dir) / pipeline_cache_file_name(_id)).string();
}

result<std::unique_ptr<pipeline_cache>> pipeline_cache::open(const device& dev, std::string dir,
                                                             std::uint64_t build_id) {
    const device_info& info = dev.info();
    pipeline_cache_identity id{info.vendor_id, info.device_id, info.driver_version,
                               info.pipeline_cache_uuid, build_id};
    std::unique_ptr<pipeline_cache> c(new pipeline_cache(dev.handle(), id, std::move(dir)));
    std::vector<std::uint8_t> file;
    if (c->_dir.empty()) {
        c->_note = "off";
    } else {
        file = read_file(c->path(), c->_note);
    }
    std::span<const std::uint8_t> seed;
    if (!file.empty()) {
        auto data = decode_pipeline_cache(file, id);
        if (data) {
            seed = *data;
            c->_loaded = true;
            c->_note = "loaded " + std::to_string(seed.size()) + " B";
        } else {
            c->_note = "ignored: " + data.err().message;
        }
    }
    c->_loaded_data.assign(seed.begin(), seed.end());
    VkPipelineCacheCreateInfo ci{VK_STRUCTURE_TYPE_PIPELINE_CACHE_CREATE_INFO};
    ci.initialDataSize = c->_loaded_data.size();
    ci.pInitialData = c->_loaded_data.empty() ? nullptr : c->_loaded_data.data();
    VkResult r = vkCreatePipelineCache(c->_device, &ci, nullptr, &c->_cache);
    if (r != VK_SUCCESS && c->_loaded) {
        // The driver refused a blob that passed our checks: start empty rather than fail.
        c->_note = "ignored: the driver refused it (" + std::string(vk_result_name(r)) + ")";
        c->_loaded = false;
        c->_loaded_data.clear();
        ci.initialDataSize = 0;
        ci.pInitialData = nullptr;
        r = vkCreatePipelineCache(c->_device, &ci, nullptr, &c->_cache);
    }
    if (r != VK_SUCCESS) return vk_error(r, "vkCreatePipelineCache");
    return c;
}

pipeline_cache::~pipeline_cache() {
    if (_cache != VK_NULL_HANDLE) vkDestroyPipelineCache(_device, _cache, nullptr);
}

status pipeline_cache::save() {
    if (_dir.empty()) return {};
    std::size_t size = 0;
    VkResult r = vkGetPipelineCacheData(_device, _cache, &size, nullptr);
    if (r != VK_SUCCESS) return vk_error(r, "vkGetPipelineCacheData");
    if (size > pipeline_cache_bytes_max - pipeline_cache_header_bytes) {
        return gpu_error(gpu_failure::cache_io, "the driver's cache is " + std::to_string(size) +
                                                    " B, more than a cache file holds");
    }
    std::vector<std::uint8_t> data(size);
    r = vkGetPipelineCacheData(_device, _cache, &size, data.data());
    if (r != VK_SUCCESS && r != VK_INCOMPLETE) return vk_error(r, "vkGetPipelineCacheData");
    data.resize(size);
    if (_loaded && data == _loaded_data) return {};  // nothing new since the file was read
    std::error_code ec;
    std::filesystem::create_directories(_dir, ec);
    if (ec) return gpu_error(gpu_failure::cache_io, "cannot create " + _dir + ": " + ec.message());
    status w = write_file_atomically(path(), encode_pipeline_cache(_id, data),
                                     std::string(enum_name(gpu_failure::cache_io)));
    if (!w) return w;
    _loaded_data = std::move(data);
    _loaded = true;
    return {};
}

}  // namespace ordo::gpu
