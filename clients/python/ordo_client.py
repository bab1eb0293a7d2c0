"""ordo_client: a small client for the ordo protocol (docs/protocol.md).

Uses Debian's python3-msgpack (run with /usr/bin/python3). One TCP connection; requests are
msgpack maps {"id", "op", ...}; every request ends with exactly one terminal event ("done" or
"error"). Events of other requests that arrive while waiting are kept and handed out later, so
several requests may be in flight on one connection.

Streaming calls (generate, chat_stream) are generators of events, the done event last; leaving
one early cancels its request. A conversation is a list of {"role", "content"} maps sent whole
with every turn:

    history = [{"role": "system", "content": "Be brief."}]
    history.append({"role": "user", "content": "Hi!"})
    reply = client.chat(history, max_tokens=64)["text"]
    history.append({"role": "assistant", "content": reply})

A server with API keys needs one: Client(api_key="...") (or ORDO_API_KEY in the environment)
sends the `auth` request first.
"""

import itertools
import os
import socket

import msgpack


class OrdoError(Exception):
    """A terminal error event: .code is the protocol's snake_case code."""

    def __init__(self, code, message):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class Client:
    def __init__(self, host="127.0.0.1", port=7070, timeout=600.0, api_key=None):
        """api_key: the server's API key (docs/protocol.md "auth"); None reads the
        ORDO_API_KEY environment variable, and with neither no auth is sent. A refused key
        raises OrdoError unauthorized here (the server then closes the connection)."""
        self._sock = socket.create_connection((host, port), timeout=timeout)
        self._unpacker = msgpack.Unpacker(raw=False)
        self._ids = itertools.count(1)
        self._pending = {}  # id -> list of events received early
        if api_key is None:
            api_key = os.environ.get("ORDO_API_KEY") or None
        if api_key is not None:
            try:
                self.call("auth", key=api_key)
            except BaseException:
                self._sock.close()
                raise

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
                if event.get("event") in ("done", "error"):
                    del self._pending[rid]  # first: a caller may stop at the terminal event
                    yield event
                    return
                yield event
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
        return self._stream("generate", prompt=prompt, **params)

    def chat(self, messages, **params):
        """One conversation turn, not streamed: returns the done event (the reply is its "text").

        messages: [{"role": "system"|"user"|"assistant"|"tool", "content": str}, ...], the
        whole conversation so far. params: chat's own (add_generation_prompt, tools,
        chat_template_kwargs) and generate's (max_tokens, temperature, session, ...).
        """
        return self.call("chat", messages=list(messages), **params)

    def chat_stream(self, messages, **params):
        """One conversation turn, streamed like generate(): yields token events, then the done
        event (append its "text" to the conversation as the assistant's message)."""
        return self._stream("chat", messages=list(messages), **params)

    def apply_template(self, messages, **params):
        """Renders the chat template without generating: the done event's "text" is the prompt
        and "tokens" its ids, exactly what chat() would evaluate."""
        return self.call("apply_template", messages=list(messages), **params)

    def cancel(self, target):
        return self.call("cancel", target=target)

    def _stream(self, op, **params):
        """Sends op with stream=True and yields its events up to the terminal one (an error
        event raises OrdoError). Leaving early (break, an exception such as KeyboardInterrupt
        in the consumer, close()) cancels the request and reads its remaining events, so the
        connection is ready for the next request."""
        rid = self.send(op, stream=True, **params)
        finished = False
        try:
            for event in self.events(rid):
                if event["event"] in ("done", "error"):
                    finished = True
                if event["event"] == "error":
                    raise OrdoError(event["code"], event["message"])
                yield event
        finally:
            if not finished:
                self._cancel_and_drain(rid)

    def _cancel_and_drain(self, rid):
        """Cancels live request rid and reads its events and the cancel's up to their terminal
        ones. A connection that already failed is left as it is: the exception that ended the
        stream is the one the caller sees."""
        try:
            cancel_id = self.send("cancel", target=rid)
            for _ in self.events(rid):
                pass
            for _ in self.events(cancel_id):
                pass
        except OSError:
            pass
