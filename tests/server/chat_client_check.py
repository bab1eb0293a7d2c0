#!/usr/bin/python3
"""chat_client_check.py: the Python client's chat calls against a running ordo-server whose
chat template is test_chat_cli.cpp's ChatML-like one (run by that test: exit 0 when every check
holds, else 1 with what differed).

Checks: apply_template renders exactly the ChatML text the template makes (with a
chat_template_kwargs variable) and gives its token ids; chat returns a done event whose
prompt_tokens is that rendering's token count; chat_stream yields token events whose texts join
into the done event's text, and greedy chat and chat_stream give the same tokens; a bad role
raises OrdoError bad_request; leaving a chat_stream early cancels that request and the client
then serves the next call on the same connection.

    /usr/bin/python3 tests/server/chat_client_check.py --port PORT
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "clients", "python"))

from ordo_client import Client, OrdoError  # noqa: E402

failures = []


def check(ok, what):
    if not ok:
        failures.append(what)
        print("FAIL:", what)


def chatml(messages, greeting):
    """What the test template renders, with add_generation_prompt."""
    text = greeting + "\n"
    for m in messages:
        text += "<|im_start|>" + m["role"] + "\n" + m["content"] + "<|im_end|>\n"
    return text + "<|im_start|>assistant\n"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    messages = [{"role": "system", "content": "Be terse."},
                {"role": "user", "content": "What is ordo?"}]
    kwargs = {"greeting": "hi there"}
    with Client(port=args.port, timeout=120.0) as client:
        rendered = client.apply_template(messages, chat_template_kwargs=kwargs)
        check(rendered["text"] == chatml(messages, "hi there"),
              f"apply_template text {rendered['text']!r}")
        check(len(rendered["tokens"]) > 0, "apply_template gave no tokens")

        done = client.chat(messages, max_tokens=8, temperature=0, chat_template_kwargs=kwargs)
        check(done["event"] == "done", f"chat ended {done}")
        check(done["usage"]["prompt_tokens"] == len(rendered["tokens"]),
              f"chat prompt_tokens {done['usage']['prompt_tokens']} != "
              f"{len(rendered['tokens'])} rendered")

        pieces, last = [], None
        for event in client.chat_stream(messages, max_tokens=8, temperature=0,
                                        chat_template_kwargs=kwargs):
            if event["event"] == "token":
                pieces.append(event["text"])
            last = event
        check(last is not None and last["event"] == "done", f"chat_stream ended {last}")
        check("".join(pieces) == last["text"], "streamed pieces do not join into done.text")
        check(last["tokens"] == done["tokens"], "chat_stream and chat differ (greedy)")

        try:
            client.chat([{"role": "wizard", "content": "hi"}], max_tokens=2)
            check(False, "a bad role was accepted")
        except OrdoError as e:
            check(e.code == "bad_request", f"a bad role gave {e.code}")

        # Leave a long stream after its first event: the request is cancelled and drained.
        stream = client.chat_stream(messages, max_tokens=200, temperature=0)
        first = next(stream)
        check(first["event"] == "token", f"first streamed event {first}")
        stream.close()
        check(not client._pending, f"events left over after close: {client._pending}")
        again = client.chat(messages, max_tokens=4, temperature=0, chat_template_kwargs=kwargs)
        check(again["tokens"] == done["tokens"][:4], "the connection after a cancelled stream")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
