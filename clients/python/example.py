#!/usr/bin/python3
"""Example: ask an ordo server for its health, then stream a completion; or, with --chat, hold
a conversation: each line of stdin is a user message, the history is sent whole every turn
(the model needs a chat template: its GGUF's, or ordo-server --chat-template FILE).

    /usr/bin/python3 clients/python/example.py [--port 7070] ["Once upon a time"]
    /usr/bin/python3 clients/python/example.py --chat [--system "Be brief."]
"""

import argparse
import sys

from ordo_client import Client, OrdoError


def complete(client, args):
    try:
        for event in client.generate(args.prompt, max_tokens=args.n, temperature=0):
            if event["event"] == "token":
                sys.stdout.write(event["text"])
                sys.stdout.flush()
            else:
                print("\n", event["reason"], event["usage"])
    except OrdoError as e:
        print("generate failed:", e)
        return 1
    return 0


def chat(client, args):
    history = [{"role": "system", "content": args.system}] if args.system else []
    for line in sys.stdin:
        history.append({"role": "user", "content": line.rstrip("\n")})
        reply = ""  # the text written so far; done.text once the turn ends
        try:
            for event in client.chat_stream(history, max_tokens=args.n):
                if event["event"] == "token":
                    reply += event["text"]
                    sys.stdout.write(event["text"])
                    sys.stdout.flush()
                else:
                    reply = event["text"]
        except OrdoError as e:
            print("chat failed:", e)
            history.pop()  # the turn failed: not part of the conversation
            if e.code in ("no_chat_template", "unknown_op"):
                return 1
            continue
        except KeyboardInterrupt:
            pass  # chat_stream cancelled the request; keep what was written so far
        print()
        history.append({"role": "assistant", "content": reply})
    return 0


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("prompt", nargs="?", default="Once upon a time")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=7070)
    parser.add_argument("-n", type=int, default=32)
    parser.add_argument("--chat", action="store_true", help="a conversation, lines of stdin")
    parser.add_argument("--system", default="", help="the system message of --chat")
    args = parser.parse_args()
    with Client(args.host, args.port) as client:
        print("health:", client.health(), file=sys.stderr if args.chat else sys.stdout)
        return chat(client, args) if args.chat else complete(client, args)


if __name__ == "__main__":
    sys.exit(main())
