// stream.cpp: see stream.hpp.
#include "gpu/vk/stream.hpp"

#include <spdlog/spdlog.h>

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
        return make_error("gpu_bad_config", "dispatches_per_segment_max must be > 0");
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
    VkCommandBufferAllocateInfo ai{VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
    ai.commandPool = _pool;
    ai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
    ai.commandBufferCount = 1;
    r = vkAllocateCommandBuffers(d, &ai, &_cmd);
    if (r != VK_SUCCESS) return vk_error(r, "stream command buffer");
    VkFenceCreateInfo fci{VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
    r = vkCreateFence(d, &fci, nullptr, &_fence);
    if (r != VK_SUCCESS) return vk_error(r, "stream fence");
    if (_options.timestamps) {
        if (!_device.info().timestamps) {
            return make_error("gpu_unsupported", "device has no compute timestamps");
        }
        VkQueryPoolCreateInfo qi{VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO};
        qi.queryType = VK_QUERY_TYPE_TIMESTAMP;
        qi.queryCount = _options.dispatches_per_segment_max + 1;
        r = vkCreateQueryPool(d, &qi, nullptr, &_queries);
        if (r != VK_SUCCESS) return vk_error(r, "stream query pool");
    }
    return {};
}

stream::~stream() {
    VkDevice d = _device.handle();
    if (_state == stream_state::in_flight) {
        // Never free a command buffer the device may still execute.
        vkWaitForFences(d, 1, &_fence, VK_TRUE, UINT64_MAX);
    }
    if (_queries != VK_NULL_HANDLE) vkDestroyQueryPool(d, _queries, nullptr);
    if (_fence != VK_NULL_HANDLE) vkDestroyFence(d, _fence, nullptr);
    if (_pool != VK_NULL_HANDLE) vkDestroyCommandPool(d, _pool, nullptr);
}

status stream::begin(std::string label) {
    if (_state != stream_state::idle) {
        return make_error("gpu_busy", "begin(" + label + "): segment '" + _label + "' is " +
                                          (_state == stream_state::recording ? "recording"
                                                                             : "in flight"));
    }
    _label = std::move(label);
    _dispatches = 0;
    _recorded.clear();
    _timings.clear();
    vkResetCommandBuffer(_cmd, 0);
    VkCommandBufferBeginInfo bi{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
    bi.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
    VkResult r = vkBeginCommandBuffer(_cmd, &bi);
    if (r != VK_SUCCESS) return vk_error(r, "segment '" + _label + "' begin");
    if (_queries != VK_NULL_HANDLE) {
        vkCmdResetQueryPool(_cmd, _queries, 0, _options.dispatches_per_segment_max + 1);
        vkCmdWriteTimestamp(_cmd, VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, _queries, 0);
    }
    _state = stream_state::recording;
    return {};
}

void stream::dispatch(pipeline_id id, std::initializer_list<buffer_view> bindings,
                      const void* push, std::size_t push_bytes,
                      std::array<std::uint32_t, 3> groups, bool barrier_after) {
    dispatch(_pipes.get(id), id, bindings, push, push_bytes, groups, barrier_after);
}

void stream::dispatch(const pipeline& pl, pipeline_id id,
                      std::initializer_list<buffer_view> bindings, const void* push,
                      std::size_t push_bytes, std::array<std::uint32_t, 3> groups,
                      bool barrier_after) {
    const device_info& info = _device.info();
    ORDO_GPU_CHECK(pl.handle != VK_NULL_HANDLE, "dispatch of a pipeline that was not built");
    ORDO_GPU_CHECK(_state == stream_state::recording, "dispatch outside a segment");
    ORDO_GPU_CHECK(_dispatches < _options.dispatches_per_segment_max,
                   "segment dispatch budget exceeded; split the step into more segments");
    ORDO_GPU_CHECK(bindings.size() == pl.bindings && pl.bindings <= bindings_max,
                   "binding count does not match the pipeline table");
    ORDO_GPU_CHECK(push_bytes == pl.push_bytes, "push-constant size does not match the table");
    for (int i = 0; i < 3; ++i) {
        ORDO_GPU_CHECK(groups[i] >= 1 && groups[i] <= info.max_workgroup_count[i],
                       "workgroup count outside maxComputeWorkGroupCount");
    }
    VkDescriptorBufferInfo infos[bindings_max]{};
    VkBufferView texel_views[bindings_max]{};
    VkWriteDescriptorSet writes[bindings_max]{};
    std::uint32_t i = 0;
    for (const buffer_view& v : bindings) {
        ORDO_GPU_CHECK(v.buf != nullptr && v.range > 0, "empty binding");
        ORDO_GPU_CHECK(v.offset + v.range <= v.buf->size(), "binding past the buffer end");
        writes[i].sType = VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET;
        writes[i].dstBinding = i;
        writes[i].descriptorCount = 1;
        if ((pl.texel_bindings >> i) & 1u) {
            // Texel bindings see the whole buffer; the encoder passes the view's start (in
            // 16-byte texels) as a push constant and checked the range against texel_count().
            ORDO_GPU_CHECK(v.buf->texel_view() != VK_NULL_HANDLE, "texel binding without view");
            ORDO_GPU_CHECK(v.offset % 16 == 0, "texel binding offset not 16-byte aligned");
            texel_views[i] = v.buf->texel_view();
            writes[i].descriptorType = VK_DESCRIPTOR_TYPE_UNIFORM_TEXEL_BUFFER;
            writes[i].pTexelBufferView = &texel_views[i];
        } else {
            ORDO_GPU_CHECK(v.range <= info.max_storage_buffer_range,
                           "binding larger than maxStorageBufferRange; split the tensor");
            ORDO_GPU_CHECK(v.offset % info.min_storage_buffer_offset_alignment == 0,
                           "binding offset not aligned to minStorageBufferOffsetAlignment");
            infos[i] = {v.buf->handle(), v.offset, v.range};
            writes[i].descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
            writes[i].pBufferInfo = &infos[i];
        }
        ++i;
    }
    vkCmdBindPipeline(_cmd, VK_PIPELINE_BIND_POINT_COMPUTE, pl.handle);
    _device.push_descriptor_fn()(_cmd, VK_PIPELINE_BIND_POINT_COMPUTE, pl.layout, 0, i, writes);
    vkCmdPushConstants(_cmd, pl.layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, pl.push_bytes, push);
    vkCmdDispatch(_cmd, groups[0], groups[1], groups[2]);
    if (barrier_after) {
        VkMemoryBarrier mb{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
        mb.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT;
        mb.dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT;
        vkCmdPipelineBarrier(_cmd, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
                             VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, 0, 1, &mb, 0, nullptr, 0,
                             nullptr);
    }
    ++_dispatches;
    _recorded.push_back(id);
    if (_queries != VK_NULL_HANDLE) {
        vkCmdWriteTimestamp(_cmd, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, _queries, _dispatches);
    }
}

void stream::copy(const buffer& src, const buffer& dst, std::span<const VkBufferCopy> regions) {
    ORDO_GPU_CHECK(_state == stream_state::recording, "copy outside a segment");
    ORDO_GPU_CHECK(_dispatches < _options.dispatches_per_segment_max,
                   "segment dispatch budget exceeded; split the copy into more segments");
    ORDO_GPU_CHECK(!regions.empty(), "copy of no regions");
    for (const VkBufferCopy& c : regions) {
        ORDO_GPU_CHECK(c.size > 0 && c.srcOffset + c.size <= src.size() &&
                           c.dstOffset + c.size <= dst.size(),
                       "copy region past a buffer end");
    }
    VkMemoryBarrier before{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
    before.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;
    before.dstAccessMask = VK_ACCESS_TRANSFER_READ_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;
    vkCmdPipelineBarrier(_cmd, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT,
                         VK_PIPELINE_STAGE_TRANSFER_BIT, 0, 1, &before, 0, nullptr, 0, nullptr);
    vkCmdCopyBuffer(_cmd, src.handle(), dst.handle(), static_cast<std::uint32_t>(regions.size()),
                    regions.data());
    VkMemoryBarrier after{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
    after.srcAccessMask = VK_ACCESS_TRANSFER_WRITE_BIT;
    after.dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT |
                          VK_ACCESS_TRANSFER_READ_BIT | VK_ACCESS_HOST_READ_BIT;
    vkCmdPipelineBarrier(_cmd, VK_PIPELINE_STAGE_TRANSFER_BIT,
                         VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT |
                             VK_PIPELINE_STAGE_HOST_BIT,
                         0, 1, &after, 0, nullptr, 0, nullptr);
    ++_dispatches;
    _recorded.push_back(pipeline_id::count);  // no pipeline: a copy
    if (_queries != VK_NULL_HANDLE) {
        vkCmdWriteTimestamp(_cmd, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, _queries, _dispatches);
    }
}

status stream::submit() {
    if (_state != stream_state::recording) {
        return make_error("gpu_busy", "submit: no segment is recording");
    }
    VkResult r = vkEndCommandBuffer(_cmd);
    if (r != VK_SUCCESS) {
        _state = stream_state::idle;
        return vk_error(r, "segment '" + _label + "' end");
    }
    vkResetFences(_device.handle(), 1, &_fence);
    VkSubmitInfo si{VK_STRUCTURE_TYPE_SUBMIT_INFO};
    si.commandBufferCount = 1;
    si.pCommandBuffers = &_cmd;
    r = vkQueueSubmit(_device.queue(), 1, &si, _fence);
    if (r != VK_SUCCESS) {
        _state = stream_state::idle;
        return vk_error(r, "segment '" + _label + "' submit");
    }
    _state = stream_state::in_flight;
    return {};
}

status stream::wait(std::uint64_t timeout_ms) {
    if (_state != stream_state::in_flight) {
        return make_error("gpu_busy", "wait: no segment in flight");
    }
    VkResult r = VK_SUCCESS;
    if (_injected) {
        r = *_injected;
        _injected.reset();
        if (r == VK_ERROR_DEVICE_LOST) {
            // The real segment still runs: let it finish so the command buffer can be reused.
            vkWaitForFences(_device.handle(), 1, &_fence, VK_TRUE, injected_drain_ns);
        }
    } else {
        r = vkWaitForFences(_device.handle(), 1, &_fence, VK_TRUE, timeout_ms * ns_per_ms);
    }
    if (r == VK_TIMEOUT) {
        logger()->error("segment '{}' exceeded the {} ms watchdog", _label, timeout_ms);
        return make_error("gpu_timeout", "segment '" + _label + "' did not finish within " +
                                             std::to_string(timeout_ms) + " ms (watchdog)");
    }
    if (r != VK_SUCCESS) {
        logger()->error("segment '{}' failed: {}", _label, vk_result_name(r));
        if (r != VK_ERROR_DEVICE_LOST) {
            // Not a lost device: the segment may still be running; it stays in flight.
            return vk_error(r, "segment '" + _label + "' fence wait");
        }
        _state = stream_state::idle;  // nothing of a lost device runs any more
        return vk_error(r, "segment '" + _label + "'");
    }
    _state = stream_state::idle;
    read_timestamps();
    return {};
}

status stream::run(std::uint64_t timeout_ms) {
    status s = submit();
    if (!s) return s;
    return wait(timeout_ms);
}

void stream::read_timestamps() {
    if (_queries == VK_NULL_HANDLE || _dispatches == 0) {
        return;
    }
    std::vector<std::uint64_t> ticks(_dispatches + 1);
    VkResult r = vkGetQueryPoolResults(_device.handle(), _queries, 0, _dispatches + 1,
                                       ticks.size() * sizeof(std::uint64_t), ticks.data(),
                                       sizeof(std::uint64_t), VK_QUERY_RESULT_64_BIT);
    if (r != VK_SUCCESS) {
        return;
    }
    double ns = _device.info().timestamp_period_ns;
    _timings.resize(_dispatches);
    for (std::uint32_t i = 0; i < _dispatches; ++i) {
        _timings[i] = {_recorded[i], static_cast<double>(ticks[i + 1] - ticks[i]) * ns * 1e-6};
    }
}

}  // namespace ordo::gpu
