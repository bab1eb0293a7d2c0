// stream.cpp: see stream.hpp.
#include "gpu/vk/stream.hpp"

#include <spdlog/spdlog.h>
#include <xxhash.h>

#include <cassert>
#include <cstring>

#include "gpu/vk/vk_util.hpp"

namespace ordo::gpu {

namespace {
constexpr std::uint64_t ns_per_ms = 1'000'000ull;
constexpr std::uint32_t bindings_max = 8;
// Bound on draining a real segment behind an injected device loss.
constexpr std::uint64_t injected_drain_ns = 60'000'000'000ull;
}  // namespace

result<std::unique_ptr<stream>> stream::create(const device& dev, const pipelines& pipes,
                                               const stream_options& options) {
    if (options.dispatches_per_segment_max == 0) {
        return gpu_error(gpu_failure::bad_config, "dispatches_per_segment_max must be > 0");
    }
    if (options.replay_segments > replay_segments_max) {
        return gpu_error(gpu_failure::bad_config,
                         "replay_segments must be at most " + std::to_string(replay_segments_max));
    }
    std::unique_ptr<stream> s(new stream(dev, pipes, options));
    status st = s->init();
    if (!st) return st.err();
    return s;
}

status stream::init() {
    VkDevice d = _device.handle();
    VkCommandPoolCreateInfo pci{VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO};
    pci.flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT;
    pci.queueFamilyIndex = _device.queue_family();
    VkResult r = vkCreateCommandPool(d, &pci, nullptr, &_pool);
    if (r != VK_SUCCESS) return vk_error(r, "stream command pool");
    for (slot& sl : _slot) {
        VkCommandBufferAllocateInfo ai{VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
        ai.commandPool = _pool;
        ai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
        ai.commandBufferCount = 1;
        r = vkAllocateCommandBuffers(d, &ai, &sl.own);
        if (r != VK_SUCCESS) return vk_error(r, "stream command buffer");
        VkFenceCreateInfo fci{VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
        r = vkCreateFence(d, &fci, nullptr, &sl.fence);
        if (r != VK_SUCCESS) return vk_error(r, "stream fence");
    }
    if (_options.timestamps) {
        if (!_device.info().timestamps) {
            return gpu_error(gpu_failure::unsupported, "device has no compute timestamps");
        }
        VkQueryPoolCreateInfo qi{VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO};
        qi.queryType = VK_QUERY_TYPE_TIMESTAMP;
        qi.queryCount = query_base(slots);
        r = vkCreateQueryPool(d, &qi, nullptr, &_queries);
        if (r != VK_SUCCESS) return vk_error(r, "stream query pool");
    }
    if (_options.timestamps) _options.replay_segments = 0;
    _kept.reserve(_options.replay_segments);
    return {};
}

stream::~stream() {
    VkDevice d = _device.handle();
    if (_flight >= 0) {
        // Never free a command buffer the device may still execute.
        vkWaitForFences(d, 1, &_slot[_flight].fence, VK_TRUE, UINT64_MAX);
    }
    if (_queries != VK_NULL_HANDLE) vkDestroyQueryPool(d, _queries, nullptr);
    for (slot& sl : _slot) {
        if (sl.fence != VK_NULL_HANDLE) vkDestroyFence(d, sl.fence, nullptr);
    }
    if (_pool != VK_NULL_HANDLE) vkDestroyCommandPool(d, _pool, nullptr);
}

stream_state stream::state() const {
    return _flight >= 0 ? stream_state::in_flight
           : _rec >= 0  ? stream_state::recording
                        : stream_state::idle;
}

const std::string& stream::label() const {
    return _slot[_flight >= 0 ? _flight : _rec >= 0 ? _rec : _last].label;
}

status stream::begin(std::string label) {
    if (state() != stream_state::idle) {
        return gpu_error(gpu_failure::busy, "begin(" + label + "): segment '" + this->label() +
                                                "' is " +
                                                (_flight >= 0 ? "in flight" : "recording"));
    }
    return start(std::move(label));
}

status stream::begin_ahead(std::string label) {
    if (_rec >= 0) {
        return gpu_error(gpu_failure::busy, "begin_ahead(" + label + "): segment '" +
                                                _slot[_rec].label + "' is recording");
    }
    return start(std::move(label));
}

status stream::begin_cmd(VkCommandBuffer cmd, int sl, VkCommandBufferUsageFlags flags) {
    vkResetCommandBuffer(cmd, 0);
    VkCommandBufferBeginInfo bi{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
    bi.flags = flags;
    VkResult r = vkBeginCommandBuffer(cmd, &bi);
    if (r != VK_SUCCESS) return vk_error(r, "segment '" + _slot[sl].label + "' begin");
    if (_queries != VK_NULL_HANDLE) {
        vkCmdResetQueryPool(cmd, _queries, query_base(sl), _options.dispatches_per_segment_max + 1);
        vkCmdWriteTimestamp(cmd, VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, _queries, query_base(sl));
    }
    return {};
}

status stream::start(std::string label) {
    // The slot not in flight (at most one is).
    int next = _flight == 0 ? 1 : 0;
    assert(next != _flight && _rec < 0);
    slot& sl = _slot[next];
    sl.label = std::move(label);
    sl.recorded.clear();
    sl.log.clear();
    sl.sealed = false;
    sl.cmd = VK_NULL_HANDLE;
    sl.logging = _options.replay_segments > 0;
    _broken.reset();
    _last = next;
    if (!sl.logging) ORDO_TRY(begin_cmd(sl.own, next, VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT));
    _rec = next;
    return {};
}

void stream::discard() {
    if (_rec < 0) return;
    slot& sl = _slot[_rec];
    // A recording command buffer may be reset directly (the pool allows resets); it was never
    // submitted, so nothing of it runs. A kept recording the segment sealed into stays kept.
    if (!sl.logging) vkResetCommandBuffer(sl.own, 0);
    sl.log.clear();
    _rec = -1;
}

status stream::stop_logging() {
    slot& sl = _slot[_rec];
    ORDO_TRY(begin_cmd(sl.own, _rec, VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT));
    for (const logged_dispatch& d : sl.log) encode(sl.own, d);
    sl.log.clear();
    sl.logging = false;
    return {};
}

status stream::seal_log(slot& sl) {
    const std::size_t bytes = sl.log.size() * sizeof(logged_dispatch);
    const std::uint64_t hash = XXH3_64bits(sl.log.data(), bytes);
    const VkCommandBuffer busy = _flight >= 0 ? _slot[_flight].cmd : VK_NULL_HANDLE;
    for (kept& k : _kept) {
        if (k.cmd != busy && k.valid && k.hash == hash && k.log.size() == sl.log.size() &&
            std::memcmp(k.log.data(), sl.log.data(), bytes) == 0) {
            k.used = ++_uses;
            sl.cmd = k.cmd;
            ++_replayed;
            return {};
        }
    }
    // Recorded into a new kept buffer while under the bound, else over the least recently used
    // one that is not in flight.
    kept* into = nullptr;
    if (_kept.size() < _options.replay_segments) {
        VkCommandBufferAllocateInfo ai{VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
        ai.commandPool = _pool;
        ai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
        ai.commandBufferCount = 1;
        VkCommandBuffer cmd = VK_NULL_HANDLE;
        VkResult r = vkAllocateCommandBuffers(_device.handle(), &ai, &cmd);
        if (r != VK_SUCCESS) return vk_error(r, "segment '" + sl.label + "' command buffer");
        into = &_kept.emplace_back();
        into->cmd = cmd;
    } else {
        for (kept& k : _kept) {
            if (k.cmd != busy && (into == nullptr || k.used < into->used)) into = &k;
        }
    }
    if (into == nullptr) {
        // The one kept buffer is in flight (replay_segments = 1): record this segment directly.
        ORDO_TRY(stop_logging());
        VkResult r = vkEndCommandBuffer(sl.own);
        if (r != VK_SUCCESS) return vk_error(r, "segment '" + sl.label + "' end");
        sl.cmd = sl.own;
        return {};
    }
    into->valid = false;
    const int sl_index = static_cast<int>(&sl - _slot);
    ORDO_TRY(begin_cmd(into->cmd, sl_index, 0));
    for (const logged_dispatch& d : sl.log) encode(into->cmd, d);
    VkResult r = vkEndCommandBuffer(into->cmd);
    if (r != VK_SUCCESS) return vk_error(r, "segment '" + sl.label + "' end");
    into->log.swap(sl.log);
    into->hash = hash;
    into->valid = true;
    into->used = ++_uses;
    sl.cmd = into->cmd;
    ++_recorded;
    return {};
}

status stream::seal() {
    if (_rec < 0) return gpu_error(gpu_failure::busy, "seal: no segment is recording");
    slot& sl = _slot[_rec];
    if (sl.sealed) return {};
    if (_broken) {
        error e = std::move(*_broken);
        _broken.reset();
        return e;
    }
    if (sl.logging) {
        ORDO_TRY(seal_log(sl));
    } else {
        VkResult r = vkEndCommandBuffer(sl.own);
        if (r != VK_SUCCESS) return vk_error(r, "segment '" + sl.label + "' end");
        sl.cmd = sl.own;
    }
    sl.sealed = true;
    return {};
}

void stream::dispatch(pipeline_id id, std::initializer_list<buffer_view> bindings, const void* push,
                      std::size_t push_bytes, std::array<std::uint32_t, 3> groups,
                      bool barrier_after) {
    dispatch(_pipes.get(id), id, bindings, push, push_bytes, groups, barrier_after);
}

void stream::dispatch(const pipeline& pl, pipeline_id id,
                      std::initializer_list<buffer_view> bindings, const void* push,
                      std::size_t push_bytes, std::array<std::uint32_t, 3> groups,
                      bool barrier_after) {
    const device_info& info = _device.info();
    ORDO_GPU_CHECK(pl.handle != VK_NULL_HANDLE, "dispatch of a pipeline that was not built");
    ORDO_GPU_CHECK(_rec >= 0, "dispatch outside a segment");
    ORDO_GPU_CHECK(_slot[_rec].recorded.size() < _options.dispatches_per_segment_max,
                   "segment dispatch budget exceeded; split the step into more segments");
    ORDO_GPU_CHECK(bindings.size() == pl.bindings && pl.bindings <= bindings_max,
                   "binding count does not match the pipeline table");
    ORDO_GPU_CHECK(push_bytes == pl.push_bytes, "push-constant size does not match the table");
    for (int i = 0; i < 3; ++i) {
        ORDO_GPU_CHECK(groups[i] >= 1 && groups[i] <= info.max_workgroup_count[i],
                       "workgroup count outside maxComputeWorkGroupCount");
    }
    ORDO_GPU_CHECK(push_bytes <= push_bytes_max, "push constants larger than the log holds");
    ORDO_GPU_CHECK(!_slot[_rec].sealed, "dispatch into a sealed segment");
    logged_dispatch d{};  // value-initialized: padding zero, so logs compare byte for byte
    d.pipeline = pl.handle;
    d.layout = pl.layout;
    d.texel_mask = pl.texel_bindings;
    d.push_bytes = pl.push_bytes;
    d.barrier_after = barrier_after ? 1 : 0;
    d.groups = groups;
    std::memcpy(d.push.data(), push, push_bytes);
    std::uint32_t i = 0;
    for (const buffer_view& v : bindings) {
        ORDO_GPU_CHECK(v.buf != nullptr && v.range > 0, "empty binding");
        ORDO_GPU_CHECK(v.offset + v.range <= v.buf->size(), "binding past the buffer end");
        logged_binding& b = d.bindings[i];
        b.handle = v.buf->handle();
        b.serial = v.buf->serial();
        b.offset = v.offset;
        b.range = v.range;
        if ((pl.texel_bindings >> i) & 1u) {
            // Texel bindings see the whole buffer; the encoder passes the view's start (in
            // 16-byte texels) as a push constant and checked the range against texel_count().
            ORDO_GPU_CHECK(v.buf->texel_view() != VK_NULL_HANDLE, "texel binding without view");
            ORDO_GPU_CHECK(v.offset % 16 == 0, "texel binding offset not 16-byte aligned");
            b.texel_view = v.buf->texel_view();
        } else {
            ORDO_GPU_CHECK(v.range <= info.max_storage_buffer_range,
                           "binding larger than maxStorageBufferRange; split the tensor");
            ORDO_GPU_CHECK(v.offset % info.min_storage_buffer_offset_alignment == 0,
                           "binding offset not aligned to minStorageBufferOffsetAlignment");
        }
        ++i;
    }
    d.n_bindings = i;
    slot& sl = _slot[_rec];
    sl.recorded.push_back(id);
    if (_broken) return;  // the segment is dropped at seal
    if (sl.logging) {
        sl.log.push_back(d);
        return;
    }
    encode(cmd(), d);
    if (_queries != VK_NULL_HANDLE) {
        vkCmdWriteTimestamp(cmd(), VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, _queries,
                            query_base(_rec) + dispatches());
    }
}

void stream::encode(VkCommandBuffer c, const logged_dispatch& d) {
    VkDescriptorBufferInfo infos[bindings_max]{};
    VkWriteDescriptorSet writes[bindings_max]{};
    for (std::uint32_t i = 0; i < d.n_bindings; ++i) {
        const logged_binding& b = d.bindings[i];
        writes[i].sType = VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET;
        writes[i].dstBinding = i;
        writes[i].descriptorCount = 1;
        if ((d.texel_mask >> i) & 1u) {
            writes[i].descriptorType = VK_DESCRIPTOR_TYPE_UNIFORM_TEXEL_BUFFER;
            writes[i].pTexelBufferView = &b.texel_view;
        } else {
            infos[i] = {b.handle, b.offset, b.range};
            writes[i].descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
            writes[i].pBufferInfo = &infos[i];
        }
    }
    vkCmdBindPipeline(c, VK_PIPELINE_BIND_POINT_COMPUTE, d.pipeline);
    _device.push_descriptor_fn()(c, VK_PIPELINE_BIND_POINT_COMPUTE, d.layout, 0, d.n_bindings,
                                 writes);
    vkCmdPushConstants(c, d.layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, d.push_bytes, d.push.data());
    vkCmdDispatch(c, d.groups[0], d.groups[1], d.groups[2]);
    if (d.barrier_after != 0) {
        VkMemoryBarrier mb{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
        mb.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT;
        mb.dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT;
        vkCmdPipelineBarrier(c, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
                             VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, 0, 1, &mb, 0, nullptr, 0,
                             nullptr);
    }
}

void stream::transfer(const std::function<void(VkCommandBuffer)>& command) {
    ORDO_GPU_CHECK(!_slot[_rec].sealed, "transfer into a sealed segment");
    if (!_broken && _slot[_rec].logging) {
        // Transfers are not logged: this segment is recorded directly from here on.
        if (status st = stop_logging(); !st) _broken = st.err();
    }
    if (_broken) {
        _slot[_rec].recorded.push_back(pipeline_id::count);
        return;  // the segment is dropped at seal
    }
    VkCommandBuffer cb = cmd();
    VkMemoryBarrier before{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
    before.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;
    before.dstAccessMask = VK_ACCESS_TRANSFER_READ_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;
    vkCmdPipelineBarrier(cb, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT,
                         VK_PIPELINE_STAGE_TRANSFER_BIT, 0, 1, &before, 0, nullptr, 0, nullptr);
    command(cb);
    VkMemoryBarrier after{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
    after.srcAccessMask = VK_ACCESS_TRANSFER_WRITE_BIT;
    after.dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT |
                          VK_ACCESS_TRANSFER_READ_BIT | VK_ACCESS_HOST_READ_BIT;
    vkCmdPipelineBarrier(cb, VK_PIPELINE_STAGE_TRANSFER_BIT,
                         VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT |
                             VK_PIPELINE_STAGE_HOST_BIT,
                         0, 1, &after, 0, nullptr, 0, nullptr);
    _slot[_rec].recorded.push_back(pipeline_id::count);  // no pipeline: a transfer
    if (_queries != VK_NULL_HANDLE) {
        vkCmdWriteTimestamp(cb, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, _queries,
                            query_base(_rec) + dispatches());
    }
}

void stream::copy(const buffer& src, const buffer& dst, std::span<const VkBufferCopy> regions) {
    ORDO_GPU_CHECK(_rec >= 0, "copy outside a segment");
    ORDO_GPU_CHECK(_slot[_rec].recorded.size() < _options.dispatches_per_segment_max,
                   "segment dispatch budget exceeded; split the copy into more segments");
    ORDO_GPU_CHECK(!regions.empty(), "copy of no regions");
    for (const VkBufferCopy& c : regions) {
        ORDO_GPU_CHECK(
            c.size > 0 && c.srcOffset + c.size <= src.size() && c.dstOffset + c.size <= dst.size(),
            "copy region past a buffer end");
    }
    transfer([&](VkCommandBuffer cb) {
        vkCmdCopyBuffer(cb, src.handle(), dst.handle(), static_cast<std::uint32_t>(regions.size()),
                        regions.data());
    });
}

void stream::fill(buffer_view dst, std::uint32_t word) {
    ORDO_GPU_CHECK(_rec >= 0, "fill outside a segment");
    ORDO_GPU_CHECK(_slot[_rec].recorded.size() < _options.dispatches_per_segment_max,
                   "segment dispatch budget exceeded");
    ORDO_GPU_CHECK(dst.buf != nullptr && dst.range > 0 && dst.offset % 4 == 0 &&
                       dst.range % 4 == 0 && dst.offset + dst.range <= dst.buf->size(),
                   "fill past a buffer end or off 4-byte words");
    transfer([&](VkCommandBuffer cb) {
        vkCmdFillBuffer(cb, dst.buf->handle(), dst.offset, dst.range, word);
    });
}

status stream::submit() {
    if (_rec < 0) {
        return gpu_error(gpu_failure::busy, "submit: no segment is recording");
    }
    if (_flight >= 0) {
        return gpu_error(gpu_failure::busy, "submit of '" + _slot[_rec].label + "': segment '" +
                                                _slot[_flight].label + "' is still in flight");
    }
    slot& sl = _slot[_rec];
    if (status sealed = seal(); !sealed) {
        discard();
        return sealed;
    }
    _rec = -1;
    vkResetFences(_device.handle(), 1, &sl.fence);
    VkSubmitInfo si{VK_STRUCTURE_TYPE_SUBMIT_INFO};
    si.commandBufferCount = 1;
    si.pCommandBuffers = &sl.cmd;
    VkResult r = vkQueueSubmit(_device.queue(), 1, &si, sl.fence);
    if (r != VK_SUCCESS) return vk_error(r, "segment '" + sl.label + "' submit");
    _flight = static_cast<int>(&sl - _slot);
    return {};
}

status stream::wait(std::uint64_t timeout_ms) {
    if (_flight < 0) {
        return gpu_error(gpu_failure::busy, "wait: no segment in flight");
    }
    const int f = _flight;
    const std::string& label = _slot[f].label;
    VkFence fence = _slot[f].fence;
    VkResult r = VK_SUCCESS;
    if (_injected) {
        r = *_injected;
        _injected.reset();
        if (r == VK_ERROR_DEVICE_LOST) {
            // The real segment still runs: let it finish so the command buffer can be reused.
            vkWaitForFences(_device.handle(), 1, &fence, VK_TRUE, injected_drain_ns);
        }
    } else {
        r = vkWaitForFences(_device.handle(), 1, &fence, VK_TRUE, timeout_ms * ns_per_ms);
    }
    if (r == VK_TIMEOUT) {
        logger()->error("segment '{}' exceeded the {} ms watchdog", label, timeout_ms);
        return gpu_error(gpu_failure::timeout, "segment '" + label + "' did not finish within " +
                                                   std::to_string(timeout_ms) + " ms (watchdog)");
    }
    if (r != VK_SUCCESS) {
        logger()->error("segment '{}' failed: {}", label, vk_result_name(r));
        if (r != VK_ERROR_DEVICE_LOST) {
            // Not a lost device: the segment may still be running; it stays in flight.
            return vk_error(r, "segment '" + label + "' fence wait");
        }
        _flight = -1;  // nothing of a lost device runs any more
        return vk_error(r, "segment '" + label + "'");
    }
    _flight = -1;
    read_timestamps(f);
    return {};
}

status stream::run(std::uint64_t timeout_ms) {
    status s = submit();
    if (!s) return s;
    return wait(timeout_ms);
}

void stream::read_timestamps(int s) {
    _timings.clear();
    const std::vector<pipeline_id>& recorded = _slot[s].recorded;
    const auto n = static_cast<std::uint32_t>(recorded.size());
    if (_queries == VK_NULL_HANDLE || n == 0) {
        return;
    }
    std::vector<std::uint64_t> ticks(n + 1);
    VkResult r = vkGetQueryPoolResults(_device.handle(), _queries, query_base(s), n + 1,
                                       ticks.size() * sizeof(std::uint64_t), ticks.data(),
                                       sizeof(std::uint64_t), VK_QUERY_RESULT_64_BIT);
    if (r != VK_SUCCESS) {
        return;
    }
    double ns = _device.info().timestamp_period_ns;
    _timings.resize(n);
    for (std::uint32_t i = 0; i < n; ++i) {
        _timings[i] = {recorded[i], static_cast<double>(ticks[i + 1] - ticks[i]) * ns * 1e-6};
    }
}

}  // namespace ordo::gpu
