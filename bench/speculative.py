#!/usr/bin/python3
"""bench/speculative.py: decode speed with speculative decoding off and on (prompt lookup, or a
draft model: docs/speculative.md), on one GGUF file, with the acceptance the server counted. A benchmark,
not a test: its numbers mean something only on an otherwise idle machine.

    /usr/bin/python3 bench/speculative.py [--model FILE] [--server BIN] [--max-tokens N]
                                          [--reps R] [--draft-tokens-max D]
                                          [--draft-model FILE]

One ordo-server (ephemeral port, [speculative] mode = "ngram", or "draft" with
--draft-model) serves every run; a request's
`speculative: false` gives plain decoding on the same server, so both modes meet the same
device, kernels and caches. Per prompt and mode, R requests (temperature 0; the output is the
same in both modes, which this checks), the modes alternating request by request, each timed
by the server (done.usage.decode_ms: first token to last; the median is printed). Steps per
request (stats.scheduler.steps) do not depend on the machine's load. Prompts:
  edit    a passage written out, then again from its beginning: the answer repeats it
          (a code edit, a quoted summary)
  free    a story opening: prompt lookup drafts only from the output's own repetitions
  echo    the upper bound: the prompt holds the model's own plain answer to `free` after the
          same opening, so nearly every draft is kept (what a self-draft would reach)
Prints one JSON line per prompt and mode, then a table. Uses Debian's python3-msgpack and
clients/python/ordo_client.py.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "clients", "python"))
from ordo_client import Client  # noqa: E402

STARTUP_S = 300  # the server's device build on lavapipe takes seconds; a bound, not a wait

EDIT = ("Once upon a time, there was a little girl named Lily. She liked to play in the park "
        "with her red ball. One day, the ball rolled under a big tree and Lily could not find "
        "it. She looked and looked, and then her friend Tom came to help her. ")
FREE = "Once upon a time, there was a little dog named Max."


def start_server(binary, model, draft_tokens_max, draft_model):
    work = tempfile.mkdtemp(prefix="ordo_spec_bench_")
    cfg = os.path.join(work, "spec.toml")
    spec = (f'mode = "draft"\ndraft_model = "{draft_model}"\n' if draft_model
            else 'mode = "ngram"\n')
    with open(cfg, "w") as f:
        f.write(f'[model]\npath = "{model}"\n[server]\nlisten = "127.0.0.1:0"\n'
                f'[http]\nlisten = ""\n'
                f'[speculative]\n{spec}draft_tokens_max = {draft_tokens_max}\n')
    proc = subprocess.Popen([binary, "--config", cfg, "--log-level", "info"],
                            stderr=subprocess.PIPE, text=True)
    port = None
    deadline = time.time() + STARTUP_S
    for line in proc.stderr:
        m = re.search(r"listening on 127\.0\.0\.1:(\d+)", line)
        if m:
            port = int(m.group(1))
            break
        if time.time() > deadline:
            break
    if port is None:
        proc.kill()
        sys.exit("ordo-server did not report its port")
    # The rest of its log is read and dropped, so the pipe never fills.
    threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
    c = Client(port=port)
    while time.time() < deadline:
        if c.health().get("status") == "ok":
            return proc, c
        time.sleep(0.2)
    proc.kill()
    sys.exit("ordo-server did not become healthy")


def run(c, prompt, speculative, max_tokens):
    t0 = time.time()
    done = None
    for e in c.generate(prompt, max_tokens=max_tokens, temperature=0, seed=1,
                        speculative=speculative):
        done = e
    wall = time.time() - t0
    u = done["usage"]
    n = u["completion_tokens"]
    decode_ms = u["decode_ms"]
    return {"tokens": done["tokens"], "text": done["text"], "completion_tokens": n,
            "decode_tok_s": (n - 1) / (decode_ms / 1000.0) if n > 1 and decode_ms > 0 else None,
            "wall_s": wall}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.join(ROOT, "..", "shared", "models",
                                                    "stories260K.gguf"))
    build = os.environ.get("ORDO_BUILD_DIR", os.path.join(ROOT, "build"))
    ap.add_argument("--server", default=os.path.join(build, "tools", "server", "ordo-server"))
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--draft-tokens-max", type=int, default=8)
    ap.add_argument("--draft-model", default="",
                    help="speculate with this draft model (mode draft) instead of prompt lookup")
    a = ap.parse_args()
    mode = "draft" if a.draft_model else "ngram"
    proc, c = start_server(a.server, os.path.abspath(a.model), a.draft_tokens_max,
                           os.path.abspath(a.draft_model) if a.draft_model else "")
    rows = []
    try:
        # The upper-bound prompt needs the plain answer to the free one.
        free_answer = run(c, FREE, False, a.max_tokens)["text"]
        prompts = {"edit": EDIT + EDIT[: len(EDIT) // 3], "free": FREE,
                   "echo": FREE + free_answer + "\n\n" + FREE}
        keys = ("spec_rounds", "spec_drafted_tokens", "spec_accepted_tokens", "steps")
        for name, prompt in prompts.items():
            # The modes alternate request by request, so a drift of the machine's speed meets
            # both alike; the counters are summed per mode.
            runs = {False: [], True: []}
            delta_of = {False: dict.fromkeys(keys, 0), True: dict.fromkeys(keys, 0)}
            for _ in range(a.reps):
                for spec in (False, True):
                    before = c.stats()["scheduler"]
                    runs[spec].append(run(c, prompt, spec, a.max_tokens))
                    after = c.stats()["scheduler"]
                    for k in keys:
                        delta_of[spec][k] += after.get(k, 0) - before.get(k, 0)
            outputs = {}
            for spec in (False, True):
                rates = [r["decode_tok_s"] for r in runs[spec] if r["decode_tok_s"]]
                delta = delta_of[spec]
                row = {"test": "speculative", "prompt": name,
                       "mode": mode if spec else "off",
                       "decode_tok_s": round(sorted(rates)[len(rates) // 2], 2) if rates else None,
                       "tokens": runs[spec][0]["completion_tokens"],
                       "steps_per_request": round(delta["steps"] / a.reps, 1),
                       "verifications": delta["spec_rounds"],
                       "drafted": delta["spec_drafted_tokens"],
                       "accepted": delta["spec_accepted_tokens"],
                       "acceptance": round(delta["spec_accepted_tokens"] /
                                           delta["spec_drafted_tokens"], 3)
                       if delta["spec_drafted_tokens"] else None,
                       "model": os.path.basename(a.model), "max_tokens": a.max_tokens}
                print(json.dumps(row), flush=True)
                rows.append(row)
                outputs[spec] = [r["tokens"] for r in runs[spec]]
            if outputs[False] != outputs[True]:
                print(f"# {name}: OUTPUT DIFFERS with speculation on", flush=True)
    finally:
        c.close()
        proc.terminate()
        proc.wait(timeout=60)
    print(f"\n| prompt | off tok/s | {mode} tok/s | speed-up | acceptance | steps off / on |")
    print("|---|---:|---:|---:|---:|---:|")
    for name in ("edit", "free", "echo"):
        off = next(r for r in rows if r["prompt"] == name and r["mode"] == "off")
        on = next(r for r in rows if r["prompt"] == name and r["mode"] == mode)
        up = (on["decode_tok_s"] / off["decode_tok_s"]
              if on["decode_tok_s"] and off["decode_tok_s"] else None)
        print(f"| {name} | {off['decode_tok_s']} | {on['decode_tok_s']} | "
              f"{f'{up:.2f}x' if up else '-'} | {on['acceptance']} | "
              f"{off['steps_per_request']} / {on['steps_per_request']} |")


if __name__ == "__main__":
    main()
