// metrics.cpp: see metrics.hpp.
#include "http/metrics.hpp"

#include <cmath>
#include <cstdio>
#include <set>

namespace ordo::http {
namespace {

// Keys of the stats op's maps that are gauges (they go down); every other key is a counter.
const std::set<std::string> k_gauges = {"connections_open",
                                        "connections_lingering",
                                        "blocks_total",
                                        "blocks_used",
                                        "blocks_free",
                                        "blocks_cached",
                                        "pins",
                                        "enabled",
                                        "ready",
                                        "persisting",
                                        "shared",
                                        "files",
                                        "sessions",
                                        "bytes",
                                        "bytes_budget",
                                        "spent"};

std::string number(double v) {
    if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%.17g", v);
    return buf;
}

// A label value: backslash, double quote and newline escaped.
std::string label(const std::string& v) {
    std::string out;
    for (char c : v) {
        if (c == '\\')
            out += "\\\\";
        else if (c == '"')
            out += "\\\"";
        else if (c == '\n')
            out += "\\n";
        else
            out += c;
    }
    return out;
}

class writer {
public:
    void one(const std::string& name, const char* type, const std::string& help, double v) {
        head(name, type, help);
        _out += name + " " + number(v) + "\n";
    }
    void counter(const std::string& base, const std::string& help, double v) {
        one(base + "_total", "counter", help, v);
    }
    void gauge(const std::string& name, const std::string& help, double v) {
        one(name, "gauge", help, v);
    }
    // A map of the stats op: gauges by k_gauges, counters otherwise.
    void map(const std::string& prefix, const std::string& what,
             const std::map<std::string, uint64_t>& m) {
        // A key that already ends in _total (connections_total, blocks_total): a counter keeps
        // one suffix; a gauge drops it (Prometheus reserves _total for counters).
        for (const auto& [k, v] : m) {
            const std::string help = "stats " + what + "." + k;
            const bool has_total = k.size() > 6 && k.compare(k.size() - 6, 6, "_total") == 0;
            const std::string base = has_total ? k.substr(0, k.size() - 6) : k;
            if (k_gauges.count(k) != 0) {
                gauge(prefix + base, help, double(v));
            } else {
                counter(prefix + base, help, double(v));
            }
        }
    }
    void histogram(const std::string& name, const door::histogram& h) {
        head(name, "histogram", "stats histograms." + name.substr(5));
        uint64_t below = 0;
        for (size_t i = 0; i < h.bounds.size(); i++) {
            below += i < h.counts.size() ? h.counts[i] : 0;
            _out += name + "_bucket{le=\"" + number(h.bounds[i]) + "\"} " + std::to_string(below) +
                    "\n";
        }
        _out += name + "_bucket{le=\"+Inf\"} " + std::to_string(h.count) + "\n";
        _out += name + "_sum " + number(h.sum) + "\n";
        _out += name + "_count " + std::to_string(h.count) + "\n";
    }
    void raw_head(const std::string& name, const char* type, const std::string& help) {
        head(name, type, help);
    }
    void line(const std::string& l) { _out += l + "\n"; }
    std::string take() { return std::move(_out); }

private:
    void head(const std::string& name, const char* type, const std::string& help) {
        _out += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
    }
    std::string _out;
};

}  // namespace

std::string prometheus_text(const door::stats_report& s) {
    writer w;
    w.gauge("ordo_active_sequences", "sequences admitted to prefill or decode",
            double(s.active_sequences));
    w.gauge("ordo_queued_requests", "generate requests waiting for a sequence slot",
            double(s.queued_requests));
    w.gauge("ordo_kv_blocks_used", "paged KV blocks in some sequence's table",
            double(s.kv_blocks_used));
    w.gauge("ordo_kv_blocks_free", "paged KV blocks allocatable", double(s.kv_blocks_free));
    w.gauge("ordo_logits_slots_held", "host logits slots waiting for the scheduler",
            double(s.logits_slots_held));
    w.gauge("ordo_resident_memory_bytes", "the server process's resident memory",
            double(s.rss_bytes));
    w.counter("ordo_log_lines_dropped",
              "log lines dropped because the log writer's queue was "
              "full (its reader is slower than the server logs)",
              double(s.log_lines_dropped));
    w.map("ordo_net_", "net", s.net);
    w.map("ordo_http_", "http", s.http);
    w.map("ordo_scheduler_", "scheduler", s.scheduler);
    w.map("ordo_kv_pool_", "kv", s.kv);

    w.gauge("ordo_gpu_epoch", "device rebuilds so far (0: the first start)", double(s.epoch));
    w.counter("ordo_gpu_steps", "gpu steps that ran", double(s.steps));
    w.counter("ordo_gpu_busy_seconds", "submit-to-fence time of the steps, summed",
              s.busy_ms / 1000.0);
    w.counter("ordo_gpu_step_wall_seconds",
              "wall time of the steps, from the scheduler sending each to its outcome, summed",
              s.step_wall_ms / 1000.0);
    w.counter("ordo_gpu_run_seconds",
              "the gpu actor's worker's wall time running the steps (their GPU time and the "
              "runner's host share), summed",
              s.run_ms / 1000.0);
    w.counter("ordo_gpu_segments", "command-buffer segments the steps ran", double(s.segments));
    w.counter("ordo_gpu_segments_replayed",
              "segments submitted as a recording kept from an earlier step, not recorded again",
              double(s.segments_replayed));
    w.counter("ordo_gpu_between_steps_seconds",
              "time from a step's outcome to the next step sent back to back, summed",
              s.between_steps_ms / 1000.0);
    w.counter("ordo_gpu_back_to_back_steps", "steps sent by the handler of the step before them",
              double(s.back_to_back_steps));
    w.counter("ordo_gpu_timeouts", "steps failed by the watchdog", double(s.timeouts));
    w.counter("ordo_gpu_device_lost", "steps failed with the device lost", double(s.device_lost));
    w.counter("ordo_gpu_nan_logits", "steps failed with NaN logits", double(s.nan_logits));
    w.counter("ordo_gpu_other_failures", "steps failed otherwise", double(s.other_failures));
    w.raw_head("ordo_gpu_info", "gauge", "the device as the gpu actor announced it");
    w.line("ordo_gpu_info{name=\"" + label(s.device.name) + "\",kernels=\"" +
           label(s.device.kernels) + "\",row_summaries=\"" +
           (s.device.row_summaries ? "on" : "off") + "\",batch_invariant=\"" +
           (s.device.batch_invariant ? "true" : "false") + "\"} 1");

    const kv::kv_disk_report& k = s.kv_disk;
    w.map("ordo_kv_disk_", "kv_disk",
          {{"enabled", k.enabled},
           {"ready", k.ready},
           {"persisting", k.persisting},
           {"files", k.files},
           {"sessions", k.sessions},
           {"bytes", k.bytes},
           {"bytes_budget", k.bytes_budget},
           {"saves", k.saves},
           {"saves_skipped", k.saves_skipped},
           {"save_failures", k.save_failures},
           {"restores", k.restores},
           {"restore_failures", k.restore_failures},
           {"quarantined", k.quarantined},
           {"evictions", k.evictions},
           {"ignored", k.ignored},
           {"probes", k.probes},
           {"shared", k.shared},
           {"session_reads", k.session_reads},
           {"gone", k.gone}});
    w.counter("ordo_kv_disk_save_seconds", "time spent writing KV files", k.save_ms / 1000.0);
    w.counter("ordo_kv_disk_restore_seconds", "time spent restoring KV files",
              k.restore_ms / 1000.0);
    w.raw_head("ordo_kv_disk_errors_total", "counter", "KV persistence errors by code");
    for (const auto& [code, n] : k.errors) {
        w.line("ordo_kv_disk_errors_total{code=\"" + label(code) + "\"} " + std::to_string(n));
    }
    if (s.fault_plan.active) {
        w.counter("ordo_fault_plan_fired", "faults the config's plan armed",
                  double(s.fault_plan.fired));
        w.counter("ordo_fault_plan_refused", "planned faults their target refused",
                  double(s.fault_plan.refused));
        w.gauge("ordo_fault_plan_spent", "1 when plan_faults_max was reached",
                s.fault_plan.spent ? 1 : 0);
    }
    for (const auto& [name, h] : s.histograms) w.histogram("ordo_" + name, h);
    return w.take();
}

}  // namespace ordo::http
