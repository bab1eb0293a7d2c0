// test_request_reader.cpp: http/request_reader (llhttp under ordo's limits), fed bytes directly.
//
// Checks: a request split at every byte boundary parses the same as whole; pipelined requests
// come out one per feed with the rest left unconsumed; keep-alive follows HTTP/1.0 and
// `Connection: close`; a chunked body is reassembled; `Expect: 100-continue` stops after the
// headers; the header bound answers 431, a declared Content-Length over the body bound 413 before
// any body byte, chunks past it 413; malformed request lines 400, and errors are final.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>

#include "http/request_reader.hpp"

namespace {

using ordo::http::http_request;
using ordo::http::request_reader;
using outcome = request_reader::outcome;

const std::string k_post =
    "POST /v1/completions?x=1 HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\n"
    "Content-Length: 11\r\n\r\n{\"a\": true}";

// Feeds `bytes` whole (in as many feeds as it takes); the completed requests.
std::vector<http_request> feed_all(request_reader& r, const std::string& bytes) {
    std::vector<http_request> out;
    size_t at = 0;
    while (at < bytes.size()) {
        auto f = r.feed(bytes.data() + at, bytes.size() - at);
        at += f.consumed;
        if (f.what == outcome::request_complete) out.push_back(*r.take());
        if (f.what == outcome::failed || (f.what == outcome::need_more && f.consumed == 0)) break;
    }
    return out;
}

}  // namespace

TEST(request_reader, parses_a_post_whole_and_byte_by_byte) {
    for (bool bytewise : {false, true}) {
        request_reader r(4096, 4096);
        std::vector<http_request> got;
        if (bytewise) {
            for (char ch : k_post) {
                auto f = r.feed(&ch, 1);
                ASSERT_EQ(f.consumed, 1u);
                if (f.what == outcome::request_complete) got.push_back(*r.take());
            }
        } else {
            got = feed_all(r, k_post);
        }
        ASSERT_EQ(got.size(), 1u) << bytewise;
        EXPECT_EQ(got[0].method, "POST");
        EXPECT_EQ(got[0].target, "/v1/completions?x=1");
        EXPECT_EQ(got[0].path, "/v1/completions");
        ASSERT_NE(got[0].header("content-type"), nullptr);
        EXPECT_EQ(*got[0].header("content-type"), "application/json");
        EXPECT_EQ(got[0].body, "{\"a\": true}");
        EXPECT_TRUE(got[0].keep_alive);
        EXPECT_FALSE(r.mid_request());
    }
}

TEST(request_reader, pipelined_requests_come_one_per_feed) {
    request_reader r(4096, 4096);
    const std::string two = "GET /health HTTP/1.1\r\n\r\n" + k_post;
    auto f = r.feed(two.data(), two.size());
    EXPECT_EQ(f.what, outcome::request_complete);
    EXPECT_EQ(f.consumed, std::string("GET /health HTTP/1.1\r\n\r\n").size());
    EXPECT_EQ(r.take()->path, "/health");
    auto g = r.feed(two.data() + f.consumed, two.size() - f.consumed);
    EXPECT_EQ(g.what, outcome::request_complete);
    EXPECT_EQ(g.consumed, two.size() - f.consumed);
    EXPECT_EQ(r.take()->body, "{\"a\": true}");
}

TEST(request_reader, keep_alive_follows_version_and_connection_header) {
    request_reader a(4096, 4096);
    EXPECT_FALSE(feed_all(a, "GET / HTTP/1.0\r\n\r\n").at(0).keep_alive);
    request_reader b(4096, 4096);
    EXPECT_FALSE(feed_all(b, "GET / HTTP/1.1\r\nConnection: close\r\n\r\n").at(0).keep_alive);
    request_reader c(4096, 4096);
    EXPECT_TRUE(feed_all(c, "GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n").at(0).keep_alive);
}

TEST(request_reader, chunked_body_is_reassembled) {
    request_reader r(4096, 4096);
    auto got = feed_all(r,
                        "POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
                        "3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n");
    ASSERT_EQ(got.size(), 1u);
    EXPECT_EQ(got[0].body, "abcde");
}

TEST(request_reader, expect_continue_stops_after_the_headers) {
    request_reader r(4096, 4096);
    const std::string head =
        "POST /x HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n";
    auto f = r.feed(head.data(), head.size());
    EXPECT_EQ(f.what, outcome::expect_continue);
    EXPECT_EQ(f.consumed, head.size());
    EXPECT_TRUE(r.mid_request());
    auto g = r.feed("hi", 2);
    EXPECT_EQ(g.what, outcome::request_complete);
    EXPECT_EQ(r.take()->body, "hi");
}

TEST(request_reader, headers_over_the_bound_are_431) {
    request_reader r(128, 4096);
    std::string big = "GET / HTTP/1.1\r\nX-Big: " + std::string(200, 'a') + "\r\n\r\n";
    auto f = r.feed(big.data(), big.size());
    EXPECT_EQ(f.what, outcome::failed);
    EXPECT_EQ(r.error().status, 431);
    EXPECT_NE(r.error().message.find("max_header_bytes"), std::string::npos);
    // Final: nothing more is read.
    EXPECT_EQ(r.feed("GET / HTTP/1.1\r\n\r\n", 18).what, outcome::failed);
}

TEST(request_reader, many_small_headers_count_too) {
    request_reader r(1024, 4096);
    std::string req = "GET / HTTP/1.1\r\n";
    for (int i = 0; i < 300; i++) req += "a:\r\n";
    req += "\r\n";
    EXPECT_EQ(r.feed(req.data(), req.size()).what, outcome::failed);
    EXPECT_EQ(r.error().status, 431);
}

TEST(request_reader, declared_body_over_the_bound_is_413_before_the_body) {
    request_reader r(4096, 1024);
    const std::string head = "POST /x HTTP/1.1\r\nContent-Length: 1025\r\n\r\n";
    auto f = r.feed(head.data(), head.size());
    EXPECT_EQ(f.what, outcome::failed);
    EXPECT_EQ(r.error().status, 413);
    EXPECT_NE(r.error().message.find("1025"), std::string::npos) << r.error().message;
}

TEST(request_reader, chunks_past_the_bound_are_413) {
    request_reader r(4096, 8);
    std::string req =
        "POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nabcde\r\n5\r\nfghij\r\n";
    EXPECT_EQ(feed_all(r, req).size(), 0u);
    EXPECT_EQ(r.error().status, 413);
}

TEST(request_reader, malformed_requests_are_400) {
    for (std::string bad : {std::string("NOT HTTP AT ALL\r\n\r\n"),
                            std::string("GET / HTTP/1.1\r\nBad Header\r\n\r\n"),
                            std::string("POST / HTTP/1.1\r\nContent-Length: x\r\n\r\n")}) {
        request_reader r(4096, 4096);
        auto f = r.feed(bad.data(), bad.size());
        EXPECT_EQ(f.what, outcome::failed) << bad;
        EXPECT_EQ(r.error().status, 400) << bad;
        EXPECT_NE(r.error().message.find("malformed"), std::string::npos) << r.error().message;
    }
}

TEST(request_reader, a_partial_request_is_mid_request) {
    request_reader r(4096, 4096);
    EXPECT_FALSE(r.mid_request());
    r.feed("GE", 2);
    EXPECT_TRUE(r.mid_request());
}

// Seeded random bytes, and valid requests with random bytes flipped, fed in random pieces: the
// reader never fails to make progress, every outcome is one of its four, a failure is final and
// names a status. (Run under ASan by ORDO_SANITIZE=1: no read outside the bytes given.)
TEST(request_reader, random_and_mutated_input_is_handled) {
    std::mt19937_64 rng(20261126);
    const std::string valid =
        k_post + "GET /health HTTP/1.1\r\nHost: x\r\n\r\n" +
        "POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n";
    for (int round = 0; round < 3000; round++) {
        std::string input = valid;
        if (round % 2 == 0) {
            input.assign(size_t(rng() % 512), '\0');
            for (char& ch : input) ch = char(rng());
        } else {
            for (int flips = 1 + int(rng() % 8); flips > 0; flips--) {
                input[rng() % input.size()] = char(rng());
            }
        }
        request_reader r(256, 256);
        size_t at = 0;
        bool failed = false;
        while (at < input.size() && !failed) {
            size_t piece = 1 + size_t(rng() % 64);
            size_t n = std::min(piece, input.size() - at);
            auto f = r.feed(input.data() + at, n);
            ASSERT_LE(f.consumed, n);
            at += f.consumed;
            switch (f.what) {
                case outcome::request_complete:
                    ASSERT_TRUE(r.take().has_value());
                    break;
                case outcome::expect_continue:
                case outcome::need_more:
                    break;
                case outcome::failed:
                    failed = true;
                    EXPECT_TRUE(r.error().status == 400 || r.error().status == 413 ||
                                r.error().status == 431 || r.error().status == 505)
                        << r.error().status;
                    EXPECT_FALSE(r.error().message.empty());
                    EXPECT_EQ(r.feed("x", 1).what, outcome::failed);
                    break;
            }
            if (f.consumed == 0 && f.what == outcome::need_more) break;
        }
    }
}
