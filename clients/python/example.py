#!/usr/bin/python3
"""Example: ask an ordo server for its health, then stream a completion.

    /usr/bin/python3 clients/python/example.py [--port 7070] ["Once upon a time"]
"""

import argparse
import sys

from ordo_client import Client, OrdoError


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("prompt", nargs="?", default="Once upon a time")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=7070)
    parser.add_argument("-n", type=int, default=32)
    args = parser.parse_args()
    with Client(args.host, args.port) as client:
        print("health:", client.health())
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


if __name__ == "__main__":
    sys.exit(main())
