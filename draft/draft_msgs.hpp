// draft_msgs.hpp: the messages between the scheduler and the draft actor (speculative decoding
// with a draft model, docs/speculative.md). The scheduler asks for a round of drafts for the
// sequences about to decode; the draft actor runs them on the draft model's own gpu actor and
// answers with greedy drafts. The draft actor holds each sequence's tokens as the scheduler told
// them, and its own KV for them, which it rolls back to the longest prefix that still agrees
// whenever a draft was rejected. Nothing here can change a request's output: drafts are only
// proposals that the target model verifies.
#pragma once

#include <cstdint>
#include <msgpack.hpp>
#include <string>
#include <vector>

namespace ordo::draft {

// One sequence of a round: its tokens from position `known` on (the draft actor holds the ones
// before, as a previous round's reply said), and how many drafts it wants.
struct draft_seq {
    uint64_t seq_id = 0;
    uint32_t known = 0;
    std::vector<int32_t> tokens;  // the sequence's tokens [known, end): prompt and output
    uint32_t max = 0;             // drafts wanted, at most
    MSGPACK_DEFINE_MAP(seq_id, known, tokens, max);
};

// scheduler → draft actor: draft for these sequences. Reply: draft_reply, exactly one, with the
// same round (a round the draft actor cannot take is answered with its error).
struct draft_request {
    static constexpr const char* msg_name = "draft_request";
    uint64_t round = 0;
    std::vector<draft_seq> seqs;
    MSGPACK_DEFINE_MAP(round, seqs);
};

// scheduler → draft actor: these sequences ended; their tokens and KV can go. No reply.
struct draft_forget {
    static constexpr const char* msg_name = "draft_forget";
    std::vector<uint64_t> seqs;
    MSGPACK_DEFINE_MAP(seqs);
};

// One sequence's drafts. `known`: the sequence's tokens the draft actor holds now (all of
// them, or 0 when it could not take the round's tokens: it had forgotten the ones before them,
// so the next round must send the sequence from token 0). No drafts is a valid answer (no
// room in the draft model's context or KV pool).
struct drafted {
    uint64_t seq_id = 0;
    uint32_t known = 0;
    std::vector<int32_t> tokens;
    MSGPACK_DEFINE_MAP(seq_id, known, tokens);
};

// draft actor → scheduler: a round's drafts, or its failure (error non-empty: the draft model's
// step failed, its device is lost or unavailable, the round was refused). A failed round sends
// its sequences back to plain decoding (the scheduler's fallback drafter_error); it fails no
// request.
struct draft_reply {
    static constexpr const char* msg_name = "draft_reply";
    uint64_t round = 0;
    std::vector<drafted> seqs;
    std::string error;
    MSGPACK_DEFINE_MAP(round, seqs, error);
};

// draft actor → scheduler: whether the draft model can take rounds (its device is built), sent
// at each change. While it cannot, sequences decode without drafts (no fallback: the requests
// speculate again once it can).
struct drafter_state {
    static constexpr const char* msg_name = "drafter_state";
    bool ready = false;
    std::string reason;  // why not, or the device it drafts on
    uint32_t n_ctx = 0;  // ready: positions the draft model reaches (past them, no drafts)
    MSGPACK_DEFINE_MAP(ready, reason, n_ctx);
};

}  // namespace ordo::draft
