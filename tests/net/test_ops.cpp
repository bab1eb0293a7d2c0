// test_ops.cpp: request parameter parsing, the one validator (net/ops.hpp).
//
// Checks: a full generate request parses into the expected values, and defaults apply when
// keys are absent (max_tokens from the limits, seed 0, greedy off); ints are accepted where
// floats are expected; a table of bad generate requests (unknown and duplicate keys, wrong
// types, floats for ints, out-of-range values, prompt XOR tokens, bad stop lists, bad sessions,
// session without kv, ids beyond the vocabulary) each give bad_request with a message naming
// the key; tokenize, detokenize, cancel and embed parse and refuse their own bad inputs.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <msgpack.hpp>
#include <string>
#include <vector>

#include "net/ops.hpp"

namespace {

using namespace ordo::net;
using namespace ordo::sched;
using packer = msgpack::packer<msgpack::sbuffer>;

// Builds {"id": 1, "op": op, <params written by fill>} and keeps the unpacked object alive.
struct frame {
    msgpack::object_handle handle;
    const msgpack::object& get() const { return handle.get(); }
};

frame make_frame(const char* op, uint32_t n_params, const std::function<void(packer&)>& fill) {
    msgpack::sbuffer buf;
    packer pk(buf);
    pk.pack_map(n_params + 2);
    pk.pack("id"), pk.pack(1);
    pk.pack("op"), pk.pack(op);
    fill(pk);
    return frame{msgpack::unpack(buf.data(), buf.size())};
}

TEST(generate_request, full_request_parses) {
    auto f = make_frame("generate", 15, [](packer& p) {
        p.pack("prompt"), p.pack("Once upon a time");
        p.pack("max_tokens"), p.pack(64);
        p.pack("temperature"), p.pack(0.5);
        p.pack("top_k"), p.pack(40);
        p.pack("top_p"), p.pack(0.9f);
        p.pack("min_p"), p.pack(0);  // an int where a float is expected: accepted
        p.pack("repeat_penalty"), p.pack(1.1);
        p.pack("presence_penalty"), p.pack(0.5);
        p.pack("frequency_penalty"), p.pack(-1);
        p.pack("seed"), p.pack(uint64_t{0xFFFFFFFFFFFFFFFFull});
        p.pack("stop"), p.pack(std::vector<std::string>{"\n\n", "END"});
        p.pack("logprobs"), p.pack(5);
        p.pack("stream"), p.pack(true);
        p.pack("session"), p.pack("chat-42_v1.0");
        p.pack("unknown_extra"), p.pack_nil();
    });
    // 15 params with one unknown: first check the unknown key is refused...
    auto bad = parse_generate(f.get(), request_limits{256, 0, true});
    ASSERT_FALSE(bad.ok());
    EXPECT_NE(bad.err().message.find("unknown_extra"), std::string::npos);

    auto g = make_frame("generate", 14, [](packer& p) {
        p.pack("prompt"), p.pack("Once upon a time");
        p.pack("max_tokens"), p.pack(64);
        p.pack("temperature"), p.pack(0.5);
        p.pack("top_k"), p.pack(40);
        p.pack("top_p"), p.pack(0.9f);
        p.pack("min_p"), p.pack(0);
        p.pack("repeat_penalty"), p.pack(1.1);
        p.pack("presence_penalty"), p.pack(0.5);
        p.pack("frequency_penalty"), p.pack(-1);
        p.pack("seed"), p.pack(uint64_t{0xFFFFFFFFFFFFFFFFull});
        p.pack("stop"), p.pack(std::vector<std::string>{"\n\n", "END"});
        p.pack("logprobs"), p.pack(5);
        p.pack("stream"), p.pack(true);
        p.pack("session"), p.pack("chat-42_v1.0");
    });
    auto r = parse_generate(g.get(), request_limits{256, 0, true});
    ASSERT_TRUE(r.ok()) << r.err().message;
    EXPECT_EQ(r->prompt, "Once upon a time");
    EXPECT_TRUE(r->tokens.empty());
    EXPECT_EQ(r->max_tokens, 64u);
    EXPECT_FLOAT_EQ(r->sampling.temperature, 0.5f);
    EXPECT_EQ(r->sampling.top_k, 40);
    EXPECT_FLOAT_EQ(r->sampling.top_p, 0.9f);
    EXPECT_FLOAT_EQ(r->sampling.min_p, 0.0f);
    EXPECT_FLOAT_EQ(r->sampling.repeat_penalty, 1.1f);
    EXPECT_FLOAT_EQ(r->sampling.presence_penalty, 0.5f);
    EXPECT_FLOAT_EQ(r->sampling.frequency_penalty, -1.0f);
    EXPECT_EQ(r->sampling.seed, 0xFFFFFFFFFFFFFFFFull);
    EXPECT_TRUE(r->seed_given);
    EXPECT_EQ(r->stop, (std::vector<std::string>{"\n\n", "END"}));
    EXPECT_EQ(r->sampling.logprobs, 5u);
    EXPECT_TRUE(r->stream);
    EXPECT_EQ(r->session, "chat-42_v1.0");
}

TEST(generate_request, defaults_apply) {
    auto f = make_frame("generate", 1, [](packer& p) {
        p.pack("tokens"), p.pack(std::vector<int>{1, 2, 3});
    });
    auto r = parse_generate(f.get(), request_limits{77, 32000, false});
    ASSERT_TRUE(r.ok()) << r.err().message;
    EXPECT_FALSE(r->prompt.has_value());
    EXPECT_EQ(r->tokens, (std::vector<int32_t>{1, 2, 3}));
    EXPECT_EQ(r->max_tokens, 77u);
    EXPECT_EQ(r->sampling.seed, seed_default);
    EXPECT_FALSE(r->seed_given);
    EXPECT_FLOAT_EQ(r->sampling.temperature, 1.0f);
    EXPECT_TRUE(r->stop.empty());
    EXPECT_FALSE(r->stream);
    EXPECT_FALSE(r->session.has_value());
    // A single stop string is accepted as a string.
    auto g = make_frame("generate", 2, [](packer& p) {
        p.pack("prompt"), p.pack("");
        p.pack("stop"), p.pack("###");
    });
    auto s = parse_generate(g.get(), request_limits{});
    ASSERT_TRUE(s.ok()) << s.err().message;
    EXPECT_EQ(s->stop, std::vector<std::string>{"###"});
}

struct bad_case {
    const char* key;  // must appear in the message
    uint32_t n_params;
    std::function<void(packer&)> fill;
};

TEST(generate_request, bad_requests_name_the_key) {
    const auto with_prompt = [](packer& p) { p.pack("prompt"), p.pack("hi"); };
    const std::vector<bad_case> cases = {
        {"frobnicate", 2,
         [&](packer& p) {
             with_prompt(p);
             p.pack("frobnicate"), p.pack(1);
         }},
        {"prompt", 2,
         [&](packer& p) {
             with_prompt(p);
             p.pack("prompt"), p.pack("again");
         }},
        {"prompt", 0, [](packer&) {}},
        {"tokens", 2,
         [&](packer& p) {
             with_prompt(p);
             p.pack("tokens"), p.pack(std::vector<int>{1});
         }},
        {"prompt", 1, [](packer& p) { p.pack("prompt"), p.pack(42); }},
        {"tokens", 1, [](packer& p) { p.pack("tokens"), p.pack("1 2 3"); }},
        {"tokens", 1, [](packer& p) { p.pack("tokens"), p.pack(std::vector<int>{}); }},
        {"tokens[1]", 1,
         [](packer& p) {
             p.pack("tokens"), p.pack(std::vector<int>{1, -2});
         }},
        {"tokens[0]", 1, [](packer& p) { p.pack("tokens"), p.pack(std::vector<double>{1.5}); }},
        {"tokens[2]", 1,
         [](packer& p) {
             p.pack("tokens"), p.pack(std::vector<int>{1, 2, 32000});
         }},
        {"grammar_triggers", 2,
         [&](packer& p) {
             with_prompt(p);
             p.pack("grammar_triggers"), p.pack(std::vector<std::string>{"<t>"});  // no grammar
         }},
        {"grammar_triggers", 3,
         [&](packer& p) {
             with_prompt(p);
             p.pack("grammar"), p.pack("root ::= \"a\"");
             p.pack("grammar_triggers"), p.pack(std::vector<std::string>{"^"});
         }},
        {"grammar_triggers", 3,
         [&](packer& p) {
             with_prompt(p);
             p.pack("grammar"), p.pack("root ::= \"a\"");
             p.pack("grammar_triggers"), p.pack(std::vector<std::string>(17, "a"));
         }},
        {"max_tokens", 2,
         [&](packer& p) {
             with_prompt(p);
             p.pack("max_tokens"), p.pack(0);
         }},
        {"max_tokens", 2,
         [&](packer& p) {
             with_prompt(p);
             p.pack("max_tokens"), p.pack(10.5);
         }},
        {"max_tokens", 2,
         [&](packer& p) {
             with_prompt(p);
             p.pack("max_tokens"), p.pack(-5);
         }},
        {"temperature", 2,
         [&](packer& p) {
             with_prompt(p);
             p.pack("temperature"), p.pack(-0.5);
         }},
        {"temperature", 2,
         [&](packer& p) {
             with_prompt(p);
             p.pack("temperature"), p.pack("hot");
         }},
        {"temperature", 2,
         [&](packer& p) {
             with_prompt(p);
             p.pack("temperature"), p.pack(1e300);
         }},
        {"top_k", 2,
         [&](packer& p) {
             with_prompt(p);
             p.pack("top_k"), p.pack(-1);
         }},
        {"top_k", 2,
         [&](packer& p) {
             with_prompt(p);
             p.pack("top_k"), p.pack(4.5);
         }},
        {"top_p", 2,
         [&](packer& p) {
             with_prompt(p);
             p.pack("top_p"), p.pack(1.5);
         }},
        {"presence_penalty", 2,
         [&](packer& p) {
             with_prompt(p);
             p.pack("presence_penalty"), p.pack(2.5);
         }},
        {"frequency_penalty", 2,
         [&](packer& p) {
             with_prompt(p);
             p.pack("frequency_penalty"), p.pack("high");
         }},
        {"top_p", 2,
         [&](packer& p) {
             with_prompt(p);
             p.pack("top_p"), p.pack(0);
         }},
        {"min_p", 2,
         [&](packer& p) {
             with_prompt(p);
             p.pack("min_p"), p.pack(1);
         }},
        {"repeat_penalty", 2,
         [&](packer& p) {
             with_prompt(p);
             p.pack("repeat_penalty"), p.pack(0);
         }},
        {"repeat_penalty", 2,
         [&](packer& p) {
             with_prompt(p);
             p.pack("repeat_penalty"), p.pack(11);
         }},
        {"seed", 2,
         [&](packer& p) {
             with_prompt(p);
             p.pack("seed"), p.pack(-1);
         }},
        {"seed", 2,
         [&](packer& p) {
             with_prompt(p);
             p.pack("seed"), p.pack(true);
         }},
        {"logprobs", 2,
         [&](packer& p) {
             with_prompt(p);
             p.pack("logprobs"), p.pack(21);
         }},
        {"stream", 2,
         [&](packer& p) {
             with_prompt(p);
             p.pack("stream"), p.pack(1);
         }},
        {"stop", 2,
         [&](packer& p) {
             with_prompt(p);
             p.pack("stop"), p.pack(7);
         }},
        {"stop", 2,
         [&](packer& p) {
             with_prompt(p);
             p.pack("stop"), p.pack("");
         }},
        {"stop[1]", 2,
         [&](packer& p) {
             with_prompt(p);
             p.pack("stop"), p.pack_array(2), p.pack("ok"), p.pack(3);
         }},
        {"stop", 2,
         [&](packer& p) {
             with_prompt(p);
             p.pack("stop"), p.pack(std::vector<std::string>(17, "x"));
         }},
        {"stop", 2,
         [&](packer& p) {
             with_prompt(p);
             p.pack("stop"), p.pack(std::string(257, 'x'));
         }},
        {"session", 2,
         [&](packer& p) {
             with_prompt(p);
             p.pack("session"), p.pack("a/b");
         }},
        {"session", 2,
         [&](packer& p) {
             with_prompt(p);
             p.pack("session"), p.pack("");
         }},
        {"session", 2,
         [&](packer& p) {
             with_prompt(p);
             p.pack("session"), p.pack(std::string(129, 'a'));
         }},
    };
    for (size_t i = 0; i < cases.size(); i++) {
        const bad_case& c = cases[i];
        auto f = make_frame("generate", c.n_params, c.fill);
        auto r = parse_generate(f.get(), request_limits{256, 32000, true});
        ASSERT_FALSE(r.ok()) << "case " << i << " (" << c.key << ") was accepted";
        if (std::getenv("ORDO_PRINT_ERRORS")) std::printf("%s\n", r.err().message.c_str());
        EXPECT_EQ(r.err().code, "bad_request");
        EXPECT_NE(r.err().message.find(std::string("\"") + c.key), std::string::npos)
            << "case " << i << ": " << r.err().message;
    }
}

TEST(generate_request, session_needs_kv_and_keys_must_be_strings) {
    auto f = make_frame("generate", 2, [](packer& p) {
        p.pack("prompt"), p.pack("hi");
        p.pack("session"), p.pack("s1");
    });
    auto r = parse_generate(f.get(), request_limits{256, 0, false});
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.err().message.find("[kv] enabled"), std::string::npos) << r.err().message;
    auto g = make_frame("generate", 2, [](packer& p) {
        p.pack("prompt"), p.pack("hi");
        p.pack(5), p.pack("five");
    });
    auto k = parse_generate(g.get(), request_limits{});
    ASSERT_FALSE(k.ok());
    EXPECT_NE(k.err().message.find("keys must be strings"), std::string::npos);
    auto h = make_frame("generate", 1, [](packer& p) { p.pack("prompt"), p.pack("caf\xC3"); });
    auto u = parse_generate(h.get(), request_limits{});
    ASSERT_FALSE(u.ok());
    EXPECT_NE(u.err().message.find("UTF-8"), std::string::npos);
}

// session_delete {session}: the same name rules as generate's session, and only with kv.
TEST(ops, session_delete_parses_and_refuses_bad_names) {
    auto f = make_frame("session_delete", 1, [](packer& p) { p.pack("session"), p.pack("s-1.x"); });
    auto r = parse_session_delete(f.get(), request_limits{256, 0, true});
    ASSERT_TRUE(r.ok()) << r.err().message;
    EXPECT_EQ(r->session, "s-1.x");
    auto off = parse_session_delete(f.get(), request_limits{256, 0, false});
    ASSERT_FALSE(off.ok());
    EXPECT_NE(off.err().message.find("[kv] enabled"), std::string::npos);
    for (const std::string& bad : {std::string("a/b"), std::string(""), std::string(129, 'a')}) {
        auto g =
            make_frame("session_delete", 1, [&](packer& p) { p.pack("session"), p.pack(bad); });
        auto e = parse_session_delete(g.get(), request_limits{256, 0, true});
        ASSERT_FALSE(e.ok()) << bad;
        EXPECT_NE(e.err().message.find("session"), std::string::npos) << e.err().message;
    }
    auto none = make_frame("session_delete", 0, [](packer&) {});
    EXPECT_FALSE(parse_session_delete(none.get(), request_limits{256, 0, true}).ok());
    auto extra = make_frame("session_delete", 2, [](packer& p) {
        p.pack("session"), p.pack("s"), p.pack("x"), p.pack(1);
    });
    EXPECT_FALSE(parse_session_delete(extra.get(), request_limits{256, 0, true}).ok());
}

TEST(generate_request, tokenize_detokenize_cancel) {
    auto t = parse_tokenize(
        make_frame("tokenize", 1, [](packer& p) { p.pack("text"), p.pack("hello"); }).get());
    ASSERT_TRUE(t.ok());
    EXPECT_EQ(t->text, "hello");
    EXPECT_FALSE(t->add_bos.has_value());
    auto t2 = parse_tokenize(make_frame("tokenize", 2, [](packer& p) {
                                 p.pack("text"), p.pack("");
                                 p.pack("add_bos"), p.pack(false);
                             }).get());
    ASSERT_TRUE(t2.ok());
    EXPECT_EQ(t2->add_bos, std::optional<bool>(false));
    EXPECT_FALSE(parse_tokenize(make_frame("tokenize", 0, [](packer&) {}).get()).ok());
    auto bad_bos = parse_tokenize(make_frame("tokenize", 2, [](packer& p) {
                                      p.pack("text"), p.pack("x");
                                      p.pack("add_bos"), p.pack("yes");
                                  }).get());
    ASSERT_FALSE(bad_bos.ok());
    EXPECT_NE(bad_bos.err().message.find("\"add_bos\""), std::string::npos);

    const request_limits vocab{256, 100, false};
    auto d = parse_detokenize(make_frame("detokenize", 1,
                                         [](packer& p) {
                                             p.pack("tokens"), p.pack(std::vector<int>{0, 99});
                                         })
                                  .get(),
                              vocab);
    ASSERT_TRUE(d.ok());
    EXPECT_EQ(d->tokens, (std::vector<int32_t>{0, 99}));
    auto d_bad = parse_detokenize(make_frame("detokenize", 1,
                                             [](packer& p) {
                                                 p.pack("tokens"), p.pack(std::vector<int>{0, 100});
                                             })
                                      .get(),
                                  vocab);
    ASSERT_FALSE(d_bad.ok());
    EXPECT_NE(d_bad.err().message.find("\"tokens[1]\""), std::string::npos);
    EXPECT_FALSE(parse_detokenize(make_frame("detokenize", 0, [](packer&) {}).get(), vocab).ok());

    auto c =
        parse_cancel(make_frame("cancel", 1, [](packer& p) { p.pack("target"), p.pack(7); }).get());
    ASSERT_TRUE(c.ok());
    EXPECT_EQ(c->target, 7u);
    for (int bad_target : {0, -3}) {
        auto cb = parse_cancel(make_frame("cancel", 1, [&](packer& p) {
                                   p.pack("target"), p.pack(bad_target);
                               }).get());
        ASSERT_FALSE(cb.ok());
        EXPECT_NE(cb.err().message.find("\"target\""), std::string::npos);
    }
    EXPECT_FALSE(parse_cancel(make_frame("cancel", 0, [](packer&) {}).get()).ok());
    auto not_map = msgpack::unpack("\x93\x01\x02\x03", 4);
    EXPECT_FALSE(parse_cancel(not_map.get()).ok());
}

TEST(ops, embed_takes_one_input_or_token_ids) {
    const request_limits vocab{256, 100, false};
    auto text = parse_embed(
        make_frame("embed", 1, [](packer& p) { p.pack("input"), p.pack("hello"); }).get(), vocab);
    ASSERT_TRUE(text.ok()) << text.err().message;
    EXPECT_EQ(text->text, std::optional<std::string>("hello"));
    EXPECT_TRUE(text->tokens.empty());
    auto ids = parse_embed(make_frame("embed", 1,
                                      [](packer& p) {
                                          p.pack("tokens"), p.pack(std::vector<int>{1, 99});
                                      })
                               .get(),
                           vocab);
    ASSERT_TRUE(ids.ok()) << ids.err().message;
    EXPECT_FALSE(ids->text.has_value());
    EXPECT_EQ(ids->tokens, (std::vector<int32_t>{1, 99}));
    struct bad_case {
        uint32_t n;
        std::function<void(packer&)> fill;
        const char* names;
    };
    const bad_case bad[] = {
        {0, [](packer&) {}, "\"input\" and \"tokens\" is required"},
        {2,
         [](packer& p) {
             p.pack("input"), p.pack("x");
             p.pack("tokens"), p.pack(std::vector<int>{1});
         },
         "got both"},
        {1, [](packer& p) { p.pack("input"), p.pack(""); }, "\"input\""},
        {1, [](packer& p) { p.pack("input"), p.pack(7); }, "\"input\""},
        {1, [](packer& p) { p.pack("tokens"), p.pack(std::vector<int>{}); }, "\"tokens\""},
        {1,
         [](packer& p) {
             p.pack("tokens"), p.pack(std::vector<int>{5, 100});
         },
         "\"tokens[1]\""},
        {2,
         [](packer& p) {
             p.pack("input"), p.pack("x");
             p.pack("pooling"), p.pack("mean");
         },
         "\"pooling\""},
    };
    for (const bad_case& b : bad) {
        auto r = parse_embed(make_frame("embed", b.n, b.fill).get(), vocab);
        ASSERT_FALSE(r.ok()) << b.names;
        EXPECT_EQ(r.err().code, "bad_request");
        EXPECT_NE(r.err().message.find(b.names), std::string::npos) << r.err().message;
    }
}

}  // namespace

namespace {

// Issue 13 defect 4: an integer-valued float passed where an integer is required, because the
// request was re-packed between actors (msgpack-c's packer writes 2.0 as the integer 2). Every
// integer parameter of every op refuses a float64 2.0 written byte for byte.
struct float_frame {
    msgpack::sbuffer buf;
    packer pk{buf};
    // A float64 exactly as a client sends it: msgpack-c's own pack(2.0) would write an integer.
    void f64(double d) {
        uint64_t bits;
        std::memcpy(&bits, &d, 8);
        char raw[9] = {char(0xcb)};
        for (int i = 0; i < 8; i++) raw[1 + i] = char(bits >> (56 - 8 * i));
        buf.write(raw, 9);
    }
};

TEST(ops, integer_valued_floats_are_refused_everywhere) {
    struct probe {
        const char* op;
        std::function<void(float_frame&)> fill;
        uint32_t n;
        const char* key;
    };
    const probe probes[] = {
        {"generate",
         [](float_frame& f) {
             f.pk.pack("tokens"), f.pk.pack(std::vector<int>{1}), f.pk.pack("max_tokens"),
                 f.f64(2.0);
         },
         2, "max_tokens"},
        {"generate", [](float_frame& f) { f.pk.pack("tokens"), f.pk.pack_array(1), f.f64(1.0); }, 1,
         "tokens[0]"},
        {"generate",
         [](float_frame& f) {
             f.pk.pack("prompt"), f.pk.pack("a"), f.pk.pack("top_k"), f.f64(3.0);
         },
         2, "top_k"},
        {"generate",
         [](float_frame& f) {
             f.pk.pack("prompt"), f.pk.pack("a"), f.pk.pack("logprobs"), f.f64(1.0);
         },
         2, "logprobs"},
        {"generate",
         [](float_frame& f) { f.pk.pack("prompt"), f.pk.pack("a"), f.pk.pack("seed"), f.f64(5.0); },
         2, "seed"},
        {"cancel", [](float_frame& f) { f.pk.pack("target"), f.f64(1.0); }, 1, "target"},
        {"detokenize", [](float_frame& f) { f.pk.pack("tokens"), f.pk.pack_array(1), f.f64(2.0); },
         1, "tokens[0]"},
        {"fault",
         [](float_frame& f) {
             f.pk.pack("kind"), f.pk.pack("hang"), f.pk.pack("layer"), f.f64(1.0);
         },
         2, "layer"},
        {"fault",
         [](float_frame& f) {
             f.pk.pack("kind"), f.pk.pack("hang"), f.pk.pack("after_steps"), f.f64(0.0);
         },
         2, "after_steps"},
        {"fault",
         [](float_frame& f) {
             f.pk.pack("kind"), f.pk.pack("hang"), f.pk.pack("count"), f.f64(1.0);
         },
         2, "count"},
    };
    for (const auto& pr : probes) {
        float_frame f;
        f.pk.pack_map(pr.n + 2);
        f.pk.pack("id"), f.pk.pack(1), f.pk.pack("op"), f.pk.pack(pr.op);
        pr.fill(f);
        auto oh = msgpack::unpack(f.buf.data(), f.buf.size());
        auto env = parse_envelope(oh.get());
        auto r = parse_op(std::get<request>(env), request_limits{256, 1000, false});
        ASSERT_FALSE(r.ok()) << pr.op << " " << pr.key;
        EXPECT_EQ(r.err().code, "bad_request");
        EXPECT_NE(r.err().message.find(pr.key), std::string::npos) << r.err().message;
        EXPECT_NE(r.err().message.find("float"), std::string::npos) << r.err().message;
    }
}

TEST(ops, fault_parses_and_names_bad_values) {
    auto f = make_frame("fault", 5, [](packer& p) {
        p.pack("kind"), p.pack("device_lost");
        p.pack("phase"), p.pack("decode");
        p.pack("layer"), p.pack(3);
        p.pack("after_steps"), p.pack(2);
        p.pack("count"), p.pack(4);
    });
    auto r = parse_fault(f.get());
    ASSERT_TRUE(r.ok()) << r.err().message;
    EXPECT_EQ(r->spec.kind, ordo::fault_kind::device_lost);
    EXPECT_EQ(r->spec.gpu_phase, ordo::gpu::step_phase::decode);
    EXPECT_EQ(r->spec.layer, 3);
    EXPECT_EQ(r->spec.after_steps, 2u);
    EXPECT_EQ(r->spec.count, 4u);
    EXPECT_EQ(r->spec.delay_ms, 0u);
    auto bad = parse_fault(
        make_frame("fault", 1, [](packer& p) { p.pack("kind"), p.pack("melt"); }).get());
    ASSERT_FALSE(bad.ok());
    EXPECT_NE(bad.err().message.find("kind"), std::string::npos);
    EXPECT_FALSE(parse_fault(make_frame("fault", 0, [](packer&) {}).get()).ok());
}

// The kv kinds parse with a count; the gpu-only fields are refused for them.
TEST(ops, fault_kv_kinds_parse_and_refuse_step_fields) {
    for (const char* kind :
         {"kv_enospc", "kv_eio", "kv_torn_exit", "kv_flip_read", "kv_fingerprint"}) {
        auto r = parse_fault(make_frame("fault", 2, [&](packer& p) {
                                 p.pack("kind"), p.pack(kind);
                                 p.pack("count"), p.pack(3);
                             }).get());
        ASSERT_TRUE(r.ok()) << kind << ": " << r.err().message;
        EXPECT_EQ(ordo::enum_name(r->spec.kind), kind);
        EXPECT_EQ(r->spec.count, 3u);
        auto d = parse_fault(
            make_frame("fault", 1, [&](packer& p) { p.pack("kind"), p.pack(kind); }).get());
        ASSERT_TRUE(d.ok());
        EXPECT_EQ(d->spec.count, 1u);
    }
    auto bad = parse_fault(make_frame("fault", 2, [](packer& p) {
                               p.pack("kind"), p.pack("kv_eio");
                               p.pack("phase"), p.pack("decode");
                           }).get());
    ASSERT_FALSE(bad.ok());
    EXPECT_EQ(bad.err().code, "bad_request");
    EXPECT_NE(bad.err().message.find("phase"), std::string::npos);
    auto unknown = parse_fault(
        make_frame("fault", 1, [](packer& p) { p.pack("kind"), p.pack("kv_melt"); }).get());
    ASSERT_FALSE(unknown.ok());
}

// kv_stall_read and kv_stall_unlink take count and ms (required, 1..10000); the other kv
// kinds' ms is refused by name.
TEST(ops, fault_kv_stalls_take_ms) {
    for (const char* kind : {"kv_stall_read", "kv_stall_unlink"}) {
        SCOPED_TRACE(kind);
        auto r = parse_fault(make_frame("fault", 3, [&](packer& p) {
                                 p.pack("kind"), p.pack(kind);
                                 p.pack("count"), p.pack(2);
                                 p.pack("ms"), p.pack(1500);
                             }).get());
        ASSERT_TRUE(r.ok()) << r.err().message;
        EXPECT_EQ(ordo::enum_name(r->spec.kind), kind);
        EXPECT_EQ(r->spec.count, 2u);
        EXPECT_EQ(r->spec.delay_ms, 1500u);
        auto missing = parse_fault(
            make_frame("fault", 1, [&](packer& p) { p.pack("kind"), p.pack(kind); }).get());
        ASSERT_FALSE(missing.ok());
        EXPECT_NE(missing.err().message.find("\"ms\" is required"), std::string::npos)
            << missing.err().message;
        for (uint64_t ms : {0ull, 10001ull}) {
            auto out = parse_fault(make_frame("fault", 2, [&](packer& p) {
                                       p.pack("kind"), p.pack(kind);
                                       p.pack("ms"), p.pack(ms);
                                   }).get());
            ASSERT_FALSE(out.ok()) << ms;
            EXPECT_NE(out.err().message.find("ms"), std::string::npos) << out.err().message;
        }
        auto actor = parse_fault(make_frame("fault", 3, [&](packer& p) {
                                     p.pack("kind"), p.pack(kind);
                                     p.pack("ms"), p.pack(10);
                                     p.pack("actor"), p.pack("kv");
                                 }).get());
        ASSERT_FALSE(actor.ok());
        EXPECT_NE(actor.err().message.find("\"actor\" does not apply"), std::string::npos);
    }
    auto other = parse_fault(make_frame("fault", 2, [](packer& p) {
                                 p.pack("kind"), p.pack("kv_flip_read");
                                 p.pack("ms"), p.pack(10);
                             }).get());
    ASSERT_FALSE(other.ok());
    EXPECT_NE(other.err().message.find("\"ms\" does not apply"), std::string::npos);
}

// The runtime fault points: step_delay takes ms (required, 1..10000) with phase/after_steps/count;
// mailbox_refuse takes actor (required, one of four) and count (1..100000). A key a kind does not
// take, a missing required key and an out-of-range value are refused, each naming its key.
TEST(ops, fault_runtime_points_parse_with_bounds) {
    auto delay = parse_fault(make_frame("fault", 5, [](packer& p) {
                                 p.pack("kind"), p.pack("step_delay");
                                 p.pack("ms"), p.pack(250);
                                 p.pack("phase"), p.pack("decode");
                                 p.pack("after_steps"), p.pack(1);
                                 p.pack("count"), p.pack(2);
                             }).get());
    ASSERT_TRUE(delay.ok()) << delay.err().message;
    EXPECT_EQ(delay->spec.kind, ordo::fault_kind::step_delay);
    EXPECT_EQ(delay->spec.delay_ms, 250u);
    EXPECT_EQ(delay->spec.gpu_phase, ordo::gpu::step_phase::decode);
    EXPECT_EQ(delay->spec.after_steps, 1u);
    EXPECT_EQ(delay->spec.count, 2u);

    auto refuse = parse_fault(make_frame("fault", 3, [](packer& p) {
                                  p.pack("kind"), p.pack("mailbox_refuse");
                                  p.pack("actor"), p.pack("net");
                                  p.pack("count"), p.pack(7);
                              }).get());
    ASSERT_TRUE(refuse.ok()) << refuse.err().message;
    EXPECT_EQ(refuse->spec.kind, ordo::fault_kind::mailbox_refuse);
    EXPECT_EQ(refuse->spec.actor, fault_actor::net);
    EXPECT_EQ(refuse->spec.count, 7u);

    // {params in the frame, the params, the key the error must name}
    struct bad_case {
        uint32_t n;
        void (*fill)(packer&);
        std::string key;
    };
    const std::vector<bad_case> bad{
        {1, [](packer& p) { p.pack("kind"), p.pack("step_delay"); }, "ms"},
        {2, [](packer& p) { p.pack("kind"), p.pack("step_delay"), p.pack("ms"), p.pack(0); }, "ms"},
        {2, [](packer& p) { p.pack("kind"), p.pack("step_delay"), p.pack("ms"), p.pack(10001); },
         "ms"},
        {3,
         [](packer& p) {
             p.pack("kind"), p.pack("step_delay"), p.pack("ms"), p.pack(5);
             p.pack("layer"), p.pack(1);
         },
         "layer"},
        {2, [](packer& p) { p.pack("kind"), p.pack("hang"), p.pack("ms"), p.pack(5); }, "ms"},
        {2, [](packer& p) { p.pack("kind"), p.pack("hang"), p.pack("actor"), p.pack("net"); },
         "actor"},
        {1, [](packer& p) { p.pack("kind"), p.pack("mailbox_refuse"); }, "actor"},
        {2,
         [](packer& p) { p.pack("kind"), p.pack("mailbox_refuse"), p.pack("actor"), p.pack("db"); },
         "actor"},
        {3,
         [](packer& p) {
             p.pack("kind"), p.pack("mailbox_refuse"), p.pack("actor"), p.pack("net");
             p.pack("count"), p.pack(100001);
         },
         "count"},
        {3,
         [](packer& p) {
             p.pack("kind"), p.pack("mailbox_refuse"), p.pack("actor"), p.pack("gpu");
             p.pack("phase"), p.pack("decode");
         },
         "phase"},
    };
    for (const auto& c : bad) {
        auto r = parse_fault(make_frame("fault", c.n, c.fill).get());
        ASSERT_FALSE(r.ok()) << c.key;
        EXPECT_EQ(r.err().code, "bad_request") << c.key;
        EXPECT_NE(r.err().message.find(c.key), std::string::npos) << r.err().message;
    }
}

// The net fault points: net_fin and net_rst take a request phase (queued, prefill, decode;
// required) and count; net_stop_reading also ms (required, 1..10000). A step phase (mixed), a
// key the kind does not take and a missing phase or ms are refused, each naming its key.
TEST(ops, fault_net_points_parse_with_bounds) {
    for (const char* kind : {"net_fin", "net_rst"}) {
        auto r = parse_fault(make_frame("fault", 3, [&](packer& p) {
                                 p.pack("kind"), p.pack(kind);
                                 p.pack("phase"), p.pack("queued");
                                 p.pack("count"), p.pack(2);
                             }).get());
        ASSERT_TRUE(r.ok()) << r.err().message;
        EXPECT_EQ(ordo::enum_name(r->spec.kind), kind);
        EXPECT_EQ(r->spec.net_phase, request_phase::queued);
        EXPECT_EQ(r->spec.count, 2u);
    }
    auto pause = parse_fault(make_frame("fault", 3, [](packer& p) {
                                 p.pack("kind"), p.pack("net_stop_reading");
                                 p.pack("phase"), p.pack("decode");
                                 p.pack("ms"), p.pack(300);
                             }).get());
    ASSERT_TRUE(pause.ok()) << pause.err().message;
    EXPECT_EQ(pause->spec.delay_ms, 300u);
    EXPECT_EQ(pause->spec.count, 1u);

    struct bad_case {
        uint32_t n;
        void (*fill)(packer&);
        std::string key;
    };
    const std::vector<bad_case> bad{
        {1, [](packer& p) { p.pack("kind"), p.pack("net_rst"); }, "phase"},
        {2, [](packer& p) { p.pack("kind"), p.pack("net_rst"), p.pack("phase"), p.pack("mixed"); },
         "phase"},
        {3,
         [](packer& p) {
             p.pack("kind"), p.pack("net_fin"), p.pack("phase"), p.pack("decode");
             p.pack("ms"), p.pack(5);
         },
         "ms"},
        {3,
         [](packer& p) {
             p.pack("kind"), p.pack("net_fin"), p.pack("phase"), p.pack("decode");
             p.pack("after_steps"), p.pack(1);
         },
         "after_steps"},
        {2,
         [](packer& p) {
             p.pack("kind"), p.pack("net_stop_reading"), p.pack("phase"), p.pack("prefill");
         },
         "ms"},
        {3,
         [](packer& p) {
             p.pack("kind"), p.pack("net_stop_reading"), p.pack("phase"), p.pack("prefill");
             p.pack("ms"), p.pack(10001);
         },
         "ms"},
        {3,
         [](packer& p) {
             p.pack("kind"), p.pack("net_rst"), p.pack("phase"), p.pack("queued");
             p.pack("actor"), p.pack("net");
         },
         "actor"},
    };
    for (const auto& c : bad) {
        auto r = parse_fault(make_frame("fault", c.n, c.fill).get());
        ASSERT_FALSE(r.ok()) << c.key;
        EXPECT_EQ(r.err().code, "bad_request") << c.key;
        EXPECT_NE(r.err().message.find(c.key), std::string::npos) << r.err().message;
    }
}

}  // namespace
