"""ordo_client: a small client for the ordo protocol (docs/protocol.md).

Uses Debian's python3-msgpack (run with /usr/bin/python3). One TCP connection; requests are
msgpack maps {"id", "op", ...}; every request ends with exactly one terminal event ("done" or
"error"). Events of other requests that arrive while waiting are kept and handed out later, so
several requests may be in flight on one connection.
"""

import itertools
import socket

import msgpack


class OrdoError(Exception):
    """A terminal error event: .code is the protocol's snake_case code."""

    def __init__(self, code, message):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class Client:
    def __init__(self, host="127.0.0.1", port=7070, timeout=600.0):
        self._sock = socket.create_connection((host, port), timeout=timeout)
        self._unpacker = msgpack.Unpacker(raw=False)
        self._ids = itertools.count(1)
        self._pending = {}  # id -> list of events received early

    def close(self):
        self._sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def send(self, op, **params):
        """Sends a request and returns its id (use events(id) to read its answers)."""
        rid = next(self._ids)
        self._sock.sendall(msgpack.packb({"id": rid, "op": op, **params}))
        self._pending.setdefault(rid, [])
        return rid

    def events(self, rid):
        """Yields the events of request rid, ending with its terminal event."""
        while True:
            queue = self._pending.get(rid)
            while queue:
                event = queue.pop(0)
                yield event
                if event.get("event") in ("done", "error"):
                    del self._pending[rid]
                    return
            data = self._sock.recv(65536)
            if not data:
                raise ConnectionError("the server closed the connection")
            self._unpacker.feed(data)
            for event in self._unpacker:
                self._pending.setdefault(event.get("id", 0), []).append(event)
                if event.get("id", 0) == 0:
                    raise OrdoError(event.get("code"), event.get("message"))

    def call(self, op, **params):
        """Sends a simple request and returns its done event (raises OrdoError on error)."""
        terminal = None
        for event in self.events(self.send(op, **params)):
            terminal = event
        if terminal["event"] == "error":
            raise OrdoError(terminal["code"], terminal["message"])
        return terminal

    def health(self):
        return self.call("health")

    def stats(self):
        return self.call("stats")

    def model(self):
        return self.call("model")

    def tokenize(self, text, add_bos=True):
        return self.call("tokenize", text=text, add_bos=add_bos)["tokens"]

    def detokenize(self, tokens):
        return self.call("detokenize", tokens=list(tokens))["text"]

    def generate(self, prompt, **params):
        """Yields token events, then returns; the done event is the generator's last item."""
        rid = self.send("generate", prompt=prompt, stream=True, **params)
        for event in self.events(rid):
            if event["event"] == "error":
                raise OrdoError(event["code"], event["message"])
            yield event

    def cancel(self, target):
        return self.call("cancel", target=target)
