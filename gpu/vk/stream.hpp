// stream.hpp: records compute work into labelled, bounded segments and runs them with a fence
// watchdog. This is the dispatch choke point: every kernel encoder (gpu/vk/kernels.hpp) records
// through stream::dispatch, which checks binding count, push-constant size, workgroup counts
// and storage-range limits against the pipeline table and the device before recording.
//
// A step of the gpu actor is: for each group of N layers, begin("decode#812 seqs=4 layers
// 8-15") ... dispatches ... submit(); wait(watchdog_ms). A fence timeout or device loss comes
// back as an ordo::error (code gpu_timeout / gpu_device_lost) whose message names the segment
// label; nothing throws or aborts. After a timeout the segment is still in flight: wait() may be
// called again (e.g. once more with a long bound before rebuilding the device), and begin()
// refuses until it has finished.
//
// Recording ahead: while a segment is in flight, begin_ahead() starts recording the next one
// (the runner records layers 4-7 while layers 0-3 run, so the host's encoding hides behind the
// GPU's work). At most one segment is ever in flight: submit() refuses until the previous one
// was waited for, so every wait still bounds exactly one segment. After a failed wait the
// segment recorded ahead is thrown away with discard().
//
// Replay (replay_segments > 0): dispatch() only checks and logs what it would record (the
// pipeline, every binding's buffer, offset and range, the push constants, the workgroups, the
// barrier); seal() (or submit()) then looks for a kept command buffer recorded from the same log
// and submits that one, else records the log into the least recently used one. A decode step
// repeats the segments of the step before it (its inputs live in buffers, not in the recording),
// so the host skips recording them. A buffer is named by its serial, never reused, so a
// recording of a destroyed buffer is never replayed; a segment with a copy or a fill is
// recorded afresh (its transfers are not logged).
//
// Threading: begin/dispatch/submit on the owner thread; wait() may run on a waiter thread while
// the owner does not touch this stream (the actor's loop never blocks on a fence).
#pragma once

#include <vulkan/vulkan.h>

#include <array>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "actors/runtime/result.hpp"
#include "gpu/vk/device.hpp"
#include "gpu/vk/pipelines.hpp"

namespace ordo::gpu {

struct stream_options {
    // Hard cap on dispatches in one segment, so no command buffer grows unbounded (F5).
    std::uint32_t dispatches_per_segment_max = 4096;
    // Record a GPU timestamp after every dispatch (per-kernel timings, see timings()).
    bool timestamps = false;
    // Segments kept recorded for replay (see "Replay" at the top): 0 = every segment is
    // recorded; never with timestamps (their queries are per submission).
    std::uint32_t replay_segments = 0;
};

// Segments kept for replay, at most (stream_options::replay_segments).
inline constexpr std::uint32_t replay_segments_max = 64;

struct dispatch_timing {
    pipeline_id id = pipeline_id::count;
    double ms = 0.0;
};

enum class stream_state { idle, recording, in_flight };

class stream {
public:
    static result<std::unique_ptr<stream>> create(const device& dev, const pipelines& pipes,
                                                  const stream_options& options);
    ~stream();
    stream(const stream&) = delete;
    stream& operator=(const stream&) = delete;

    // Starts recording a segment. Error if one is recording or still in flight.
    status begin(std::string label);
    // Starts recording the next segment while one may still be in flight (record ahead; see the
    // top). Error if one is recording.
    status begin_ahead(std::string label);
    // Drops the segment being recorded (never submitted). No-op when none is.
    void discard();

    // The choke point. Records one dispatch of `id` with exactly pipeline.bindings views and a
    // push struct of exactly pipeline.push_bytes, followed by a compute->compute barrier unless
    // `barrier_after` is false (independent dispatches, e.g. the row chunks of one mat-mul).
    void dispatch(pipeline_id id, std::initializer_list<buffer_view> bindings, const void* push,
                  std::size_t push_bytes, std::array<std::uint32_t, 3> groups,
                  bool barrier_after = true);
    template <typename Push>
    void dispatch(pipeline_id id, std::initializer_list<buffer_view> bindings, const Push& push,
                  std::array<std::uint32_t, 3> groups, bool barrier_after = true) {
        dispatch(id, bindings, &push, sizeof(Push), groups, barrier_after);
    }
    // The same for a pipeline specialized beyond its table entry (pipelines::for_k); `id` is
    // its table row (timings, checks).
    void dispatch(const pipeline& pl, pipeline_id id, std::initializer_list<buffer_view> bindings,
                  const void* push, std::size_t push_bytes, std::array<std::uint32_t, 3> groups,
                  bool barrier_after = true);
    template <typename Push>
    void dispatch(const pipeline& pl, pipeline_id id, std::initializer_list<buffer_view> bindings,
                  const Push& push, std::array<std::uint32_t, 3> groups,
                  bool barrier_after = true) {
        dispatch(pl, id, bindings, &push, sizeof(Push), groups, barrier_after);
    }

    // Records one buffer-to-buffer copy of `regions` (KV blocks to or from host staging),
    // counted as one dispatch against the segment's bound. It is ordered after every earlier
    // kernel and copy of the segment, and its writes are made visible to later kernels, copies
    // and to the host once the segment's fence has signalled. Regions are checked against both
    // buffers' sizes.
    void copy(const buffer& src, const buffer& dst, std::span<const VkBufferCopy> regions);
    // Records a fill of `dst` (4-byte aligned) with `word`, ordered and counted like a copy
    // (the nan_logits fault: NaNs written where the logits head wrote its rows).
    void fill(buffer_view dst, std::uint32_t word);

    // Ends recording: finds the kept recording of the same log or records it (replay; a no-op
    // otherwise, and when already sealed). The runner calls it as soon as a segment is recorded
    // ahead, so the recording overlaps the segment in flight. Error: a Vulkan failure (the
    // segment is dropped).
    status seal();
    // Ends recording (seal) and submits the segment with its fence. Error (gpu_busy, the
    // recording kept) while another segment is in flight.
    status submit();
    // Waits for the submitted segment for at most timeout_ms. VK_TIMEOUT -> gpu_timeout,
    // VK_ERROR_DEVICE_LOST -> gpu_device_lost; both name the segment label.
    status wait(std::uint64_t timeout_ms);
    // begin's work already recorded: submit() then wait(timeout_ms).
    status run(std::uint64_t timeout_ms);

    // Fault injection (harness, tests): the next wait() reports `r` as the fence result instead
    // of waiting for real, through the same error path (then the fence is still waited on, so
    // the stream stays consistent).
    void inject_wait_result(VkResult r) { _injected = r; }

    // The segment in flight's label, else the one recording's, else the last one's.
    const std::string& label() const;
    // in_flight while a segment is in flight (whether or not the next one is recording).
    stream_state state() const;
    bool recording() const { return _rec >= 0; }
    // Dispatches recorded in the segment begun last.
    std::uint32_t dispatches() const {
        return static_cast<std::uint32_t>(_slot[_last].recorded.size());
    }
    // Per-dispatch GPU times of the last finished segment (empty unless options.timestamps).
    const std::vector<dispatch_timing>& timings() const { return _timings; }
    // Segments submitted as a kept recording, and segments recorded (replay on).
    std::uint64_t replayed() const { return _replayed; }
    std::uint64_t recorded() const { return _recorded; }
    const device& dev() const { return _device; }
    const pipelines& pipes() const { return _pipes; }
    // Where the tiled mat-mul's group split writes its partial sums (encode_mul_mat; sized by
    // mat_split_scratch_floats): set by the runner; an empty view (the default) never splits.
    void set_mat_split_scratch(buffer_view v) { _mat_split_scratch = v; }
    const buffer_view& mat_split_scratch() const { return _mat_split_scratch; }
    // The token counts encode_mul_mat's automatic path serves with mul_mat_vec on a device
    // that runs it (kernels.hpp): 0 = kernels.hpp's mat_vec_tokens_max; the runner sets the
    // crossover it measured at warm-up.
    void set_mat_vec_tokens_max(std::uint32_t n) { _mat_vec_tokens_max = n; }
    std::uint32_t mat_vec_tokens_max() const { return _mat_vec_tokens_max; }
    // The token count from which the cooperative-matrix mat-mul runs its large tile
    // (pipeline_tuning::mat_coop_large; 0, the default: never): the runner sets what it
    // measured at warm-up.
    void set_mat_coop_large_from(std::uint32_t n) { _mat_coop_large_from = n; }
    std::uint32_t mat_coop_large_from() const { return _mat_coop_large_from; }
    // The invariant tiled mul_mat's layout by token count: (from tokens, layout) entries in
    // increasing order, a step of n tokens running the last one from at most n; none (the
    // default) or before the first: the tuning's. The runner sets what it measured at warm-up
    // (runner::choose_mat_tiled_layouts). The same bits in every layout.
    void set_mat_tiled_layouts(std::vector<std::pair<std::uint32_t, mat_tiled_layout>> v) {
        _mat_tiled_layouts = std::move(v);
    }
    const std::vector<std::pair<std::uint32_t, mat_tiled_layout>>& mat_tiled_layouts() const {
        return _mat_tiled_layouts;
    }
    // The layout a tiled step of `n_tokens` runs (nullptr: the tuning's).
    const mat_tiled_layout* mat_tiled_layout_for(std::uint32_t n_tokens) const {
        const mat_tiled_layout* l = nullptr;
        for (const auto& [from, layout] : _mat_tiled_layouts) {
            if (from <= n_tokens) l = &layout;
        }
        return l;
    }

private:
    stream(const device& dev, const pipelines& pipes, const stream_options& options)
        : _device(dev), _pipes(pipes), _options(options) {}
    // One dispatch as recorded: compared byte for byte (value-initialized, so its padding is
    // zero too) and replayed into a command buffer.
    struct logged_binding {
        VkBuffer handle;
        VkBufferView texel_view;  // the texel bindings'
        std::uint64_t serial, offset, range;
    };
    static constexpr std::size_t push_bytes_max = 128;  // the least maxPushConstantsSize
    struct logged_dispatch {
        VkPipeline pipeline;
        VkPipelineLayout layout;
        std::uint32_t texel_mask, n_bindings, push_bytes, barrier_after;
        std::array<std::uint32_t, 3> groups;
        std::array<logged_binding, 8> bindings;
        std::array<unsigned char, push_bytes_max> push;
    };
    // A command buffer kept for replay, with the log it was recorded from.
    struct kept {
        VkCommandBuffer cmd = VK_NULL_HANDLE;
        std::vector<logged_dispatch> log;
        std::uint64_t hash = 0;  // XXH3 of the log
        std::uint64_t used = 0;  // _uses when last sealed: the least recent is recorded over
        bool valid = false;      // false while (or after failing) being recorded
    };
    // One recordable segment: two, so the next records while the other runs.
    struct slot {
        VkCommandBuffer own = VK_NULL_HANDLE;  // recorded directly (replay off, transfers)
        VkCommandBuffer cmd = VK_NULL_HANDLE;  // what submit() submits: own or a kept one's
        VkFence fence = VK_NULL_HANDLE;
        std::string label;
        std::vector<pipeline_id> recorded;  // per dispatch (count: a copy)
        bool logging = false;               // replay: dispatches go to `log`, not to `own`
        bool sealed = false;
        std::vector<logged_dispatch> log;
    };
    static constexpr int slots = 2;

    status init();
    status start(std::string label);
    // Begins `cmd` for recording (the timestamp reset and first query where they are on).
    status begin_cmd(VkCommandBuffer cmd, int slot, VkCommandBufferUsageFlags flags);
    void encode(VkCommandBuffer c, const logged_dispatch& d);
    // A logging slot that meets a transfer: its log so far goes into `own`, which it records
    // directly from then on.
    status stop_logging();
    // The kept recording of the slot's log, found or recorded.
    status seal_log(slot& sl);
    void read_timestamps(int slot);
    // Records `command` (a transfer) between barriers against every earlier and later kernel,
    // transfer and host read, counted as one dispatch (copy, fill).
    void transfer(const std::function<void(VkCommandBuffer)>& command);
    std::uint32_t query_base(int slot) const {
        return static_cast<std::uint32_t>(slot) * (_options.dispatches_per_segment_max + 1);
    }
    VkCommandBuffer cmd() const { return _slot[_rec].own; }

    const device& _device;
    const pipelines& _pipes;
    stream_options _options;
    VkCommandPool _pool = VK_NULL_HANDLE;
    VkQueryPool _queries = VK_NULL_HANDLE;  // slots x (dispatches_per_segment_max + 1)
    slot _slot[slots];
    int _rec = -1;     // the slot recording, or -1
    int _flight = -1;  // the slot in flight, or -1
    int _last = 0;     // the slot begun last
    std::vector<dispatch_timing> _timings;
    std::optional<VkResult> _injected;
    buffer_view _mat_split_scratch;
    std::uint32_t _mat_vec_tokens_max = 0;
    std::uint32_t _mat_coop_large_from = 0;
    std::vector<std::pair<std::uint32_t, mat_tiled_layout>> _mat_tiled_layouts;
    std::vector<kept> _kept;  // at most options.replay_segments
    std::uint64_t _uses = 0, _replayed = 0, _recorded = 0;
    // A logging segment that could not begin recording directly for a transfer: dispatches
    // and transfers after it are skipped, and seal()/submit() return this.
    std::optional<error> _broken;
};

}  // namespace ordo::gpu
