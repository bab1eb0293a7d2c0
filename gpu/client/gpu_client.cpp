// gpu_client.cpp: see gpu_client.hpp.
#include "gpu/client/gpu_client.hpp"

#include <chrono>
#include <cstring>

#include "model/gguf.hpp"
#include "model/llama.hpp"

namespace ordo::gpu {

std::string reply_name(const gpu_reply& r) {
    return std::visit([](const auto& m) { return std::string(m.msg_name); }, r);
}

void reply_collector::push(gpu_reply r) {
    std::lock_guard lock(_mutex);
    _replies.push_back(std::move(r));
    _cv.notify_all();
}

void reply_collector::on(const device_progress& m) {
    std::lock_guard lock(_mutex);
    _last_progress = m;
    _progress_count++;
}

std::optional<device_progress> reply_collector::last_progress() {
    std::lock_guard lock(_mutex);
    return _last_progress;
}

std::uint64_t reply_collector::progress_count() {
    std::lock_guard lock(_mutex);
    return _progress_count;
}

std::optional<gpu_reply> reply_collector::next(std::uint64_t timeout_ms) {
    std::unique_lock lock(_mutex);
    if (!_cv.wait_for(lock, std::chrono::milliseconds(timeout_ms),
                      [&] { return !_replies.empty(); })) {
        return std::nullopt;
    }
    gpu_reply r = std::move(_replies.front());
    _replies.pop_front();
    return r;
}

result<std::unique_ptr<gpu_session>> gpu_session::start(gpu_actor_options options,
                                                        std::uint64_t ready_timeout_ms,
                                                        kv_staging* staging,
                                                        std::uint32_t summary_rows_max) {
    std::unique_ptr<gpu_session> s(new gpu_session());
    {
        auto f = model::gguf_file::open(options.model_path);
        if (!f) return f.err();
        auto hp = model::read_llama_hparams(*f);
        if (!hp) return hp.err();
        s->_exchange = std::make_unique<logits_exchange>(options.runner.rows_max, hp->n_vocab,
                                                         hp->n_embd, summary_rows_max);
    }
    status st = s->_collector.start();
    if (!st) return st.err();
    s->_actor = std::make_unique<gpu_actor>(std::move(options), *s->_exchange,
                                            gpu_replies(s->_collector, "gpu"));
    if (staging != nullptr) s->_actor->connect_kv(*staging, kv_copy_replies(s->_collector, "gpu"));
    st = s->_actor->start();
    if (!st) return st.err();
    auto r = s->_collector.next(ready_timeout_ms);
    if (!r) return make_error("gpu_timeout", "no device_ready within the start-up bound");
    if (auto* u = std::get_if<device_unavailable>(&*r)) {
        return make_error("gpu_unavailable", u->message);
    }
    if (!std::holds_alternative<device_ready>(*r)) {
        return make_error("gpu_protocol", "expected device_ready, got " + reply_name(*r));
    }
    s->_ready = std::get<device_ready>(*r);
    return s;
}

gpu_session::~gpu_session() {
    (void)stop();
}

result<step_done> gpu_session::send_and_wait(const step& s, std::uint64_t timeout_ms) {
    actors::tell_status sent = _actor->tell(s, "gpu_session");
    if (!sent) return sent.err().as_error();
    auto r = _collector.next(timeout_ms);
    if (!r) return make_error("gpu_timeout", "no reply to step " + std::to_string(s.step_id));
    if (auto* f = std::get_if<step_failed>(&*r)) {
        std::string where = f->segment.empty() ? "" : " [" + f->segment + "]";
        return make_error(std::string(enum_name(f->code)), f->message + where);
    }
    auto* d = std::get_if<step_done>(&*r);
    if (d == nullptr || d->step_id != s.step_id) {
        return make_error("gpu_protocol", "unexpected reply " + reply_name(*r));
    }
    return *d;
}

result<step_done> gpu_session::run_greedy(const step& s, std::vector<std::int32_t>& tokens,
                                          std::uint64_t timeout_ms) {
    auto d = send_and_wait(s, timeout_ms);
    if (!d) return d;
    const std::uint32_t n_sample = s.sample_vocab != 0 ? s.sample_vocab : d->n_vocab;
    tokens.resize(d->rows.size());
    for (std::size_t i = 0; i < d->rows.size(); ++i) {
        tokens[i] = _exchange->greedy_token(d->slot, static_cast<std::uint32_t>(i), d->summarized,
                                            n_sample);
    }
    _exchange->release(d->slot);
    return d;
}

result<step_done> gpu_session::run(const step& s, std::vector<float>& logits,
                                   std::uint64_t timeout_ms, std::vector<float>* hidden) {
    auto done = send_and_wait(s, timeout_ms);
    if (!done) return done;
    step_done* d = &*done;
    logits.resize(d->rows.size() * std::size_t(d->n_vocab));
    for (std::size_t i = 0; i < d->rows.size(); ++i) {
        auto row = _exchange->read_row(d->slot, static_cast<std::uint32_t>(i));
        std::memcpy(logits.data() + i * d->n_vocab, row.data(), row.size() * sizeof(float));
    }
    if (hidden != nullptr) {
        const std::size_t n_embd = _exchange->n_embd();
        hidden->resize(d->hidden_rows.size() * n_embd);
        for (std::size_t i = 0; i < d->hidden_rows.size(); ++i) {
            auto row = _exchange->read_hidden_row(d->slot, static_cast<std::uint32_t>(i));
            std::memcpy(hidden->data() + i * n_embd, row.data(), row.size() * sizeof(float));
        }
    }
    _exchange->release(d->slot);
    return *d;
}

status gpu_session::stop() {
    if (_stopped) return {};
    _stopped = true;
    status a{}, c{};
    if (_actor) {
        _actor->request_stop();
        a = _actor->join();
    }
    _collector.request_stop();
    c = _collector.join();
    return a.ok() ? c : a;
}

}  // namespace ordo::gpu
