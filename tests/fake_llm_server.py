"""A local OpenAI-compatible chat and embeddings server (127.0.0.1 only) that answers like a model and injects faults.

It answers Strata's prompts with valid outputs (entities from capitalised phrases, relations
between consecutive entities, summary entities, community reports, answers) and, on demand,
with faults: 429 with ``Retry-After``, 500, hangs past the client's timeout, malformed answers
(marked ``MALFORMED``) and empty content. A fixed latency can be added to every request.
Used by the tests and by ``benchmarks/bench_llm.py``; every request loop is bounded by its caller.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

_CAPS = re.compile(r"\b([A-Z][a-z]+(?:\s+(?:of\s+)?[A-Z][a-z]+)*)\b")
#: capitalised words a model does not list as entities (a sentence's first word): a realistic answer drops them
_FUNCTION = frozenset(
    "a about after all also an and any as at before both but by during each every few for from he her here his how "
    "i if in into it its many more most my no not of on once one only or other our over she since so some such than "
    "that the their then there these they this those through to under until upon we what when where which while who "
    "why with without yet you your".split()
)
_TEXT = re.compile(r'"""\n(.*?)\n"""', re.DOTALL)
_LISTED = re.compile(r"^- (.+?) \(", re.MULTILINE)
_NAMES = re.compile(r"^- (.+?) \(\w+\)$", re.MULTILINE | re.DOTALL)
_PASSAGES = re.compile(r'^Passage (\d+):\n"""\n(.*?)\n"""', re.DOTALL | re.MULTILINE)


_LINES = re.compile(r"^- (.+?) \((\w+)\): (.*)$", re.MULTILINE)


def _clip(text: str, words: int) -> str:
    parts = text.split()
    return " ".join(parts[:words]) + ("..." if len(parts) > words else "")


def _text_of(user: str) -> str:
    """The chunk's text a prompt quotes (its whole user message where it quotes none)."""
    found = _TEXT.search(user)
    return found.group(1) if found else user


def _sentence_naming(text: str, *names: str) -> str:
    """The first sentence of ``text`` that names all of ``names`` ("" if none)."""
    return next((s for s in re.split(r"(?<=[.!?])\s+", text) if all(n in s for n in names)), "")


def _between(text: str, a: str, b: str) -> str:
    """A label for the pair: the first three lowercase words between ``a`` and ``b`` in a sentence naming both, else
    "related to"."""
    sentence = _sentence_naming(text, a, b)
    middle = sentence.split(a, 1)[-1].split(b, 1)[0] if sentence else ""
    words = re.findall(r"[a-z]+", middle)[:3]
    return " ".join(words) or "related to"


def _names_of(text: str, realistic: bool) -> list[str]:
    """The text's capitalised phrases, in order, each once (the first 12; ``realistic``: every one, without a
    leading function word, and no phrase that is only one, as a model lists them)."""
    found = (m.group(1) for m in _CAPS.finditer(text))
    if not realistic:
        return list(dict.fromkeys(found))[:12]
    names = []
    for phrase in found:
        words = phrase.split()
        while words and words[0].lower() in _FUNCTION:
            words = words[1:]
        if words:
            names.append(" ".join(words))
    return list(dict.fromkeys(names))


def answer_for(messages: list[dict], realistic: bool = False) -> str:
    """An answer in the shape each of Strata's prompts asks for. ``realistic``: descriptions, summaries and findings
    of a model's length (a sentence of the text per entity and relation, a few sentences per summary and report)
    and every name of a chunk (not the first 12, no "The" or "It": ``_names_of``) — what a cost measurement needs."""
    system = messages[0]["content"] if messages else ""
    user = next((m["content"] for m in messages if m["role"] == "user"), "")
    if "For each numbered passage" in system:  # one pass over a pack: names, types, labelled pairs (no descriptions)
        passages = []
        for number, text in _PASSAGES.findall(user) if len(messages) <= 2 else []:  # gleaning: nothing missed
            names = _names_of(text, realistic)
            passages.append({"passage": int(number),
                             "entities": [[n, "person" if len(n.split()) == 2 else "concept"] for n in names],
                             "relations": [[a, _between(text, a, b), b, 5] for a, b in zip(names, names[1:])]})
        return json.dumps({"passages": passages})
    if "Identify every meaningful entity" in system:
        text = _text_of(user)
        names = _names_of(text, realistic)
        if len(messages) > 2:  # gleaning: nothing missed
            names = []

        def said(n: str) -> str:
            return _clip(_sentence_naming(text, n), 30) if realistic else f"{n} appears in the text."

        return json.dumps({"entities": [{"name": n, "type": "person" if len(n.split()) == 2 else "concept",
                                         "description": said(n)} for n in names]})
    if "clearly related" in system:  # the names listed before the text, a name across lines too
        names = _NAMES.findall(user.split('\n\nText:\n"""', 1)[0])
        text = _text_of(user)

        def how(a: str, b: str) -> str:
            return _clip(_sentence_naming(text, a, b) or f"{a} and {b} are named in the same passage.", 25) \
                if realistic else f"{a} is mentioned with {b}."

        return json.dumps({"relations": [{"source": a, "target": b, "description": how(a, b),
                                          "strength": 5} for a, b in zip(names, names[1:])]})
    lines = _LINES.findall(user)
    if "into a hierarchy" in system:
        names = _LISTED.findall(user)
        head = names[0] if names else "Theme"
        shared = f"What {', '.join(names[:3])} share."
        if realistic:
            shared += " " + _clip(" ".join(d for _n, _t, d in lines[:3]), 50)
        return json.dumps({"summary_entities": [{"name": f"Theme of {head}", "type": "concept",
                                                 "description": shared}]})
    if "reports about communities" in system:
        names = _LISTED.findall(user)
        summary = _clip(" ".join(d for _n, _t, d in lines[:5]), 110) if realistic and lines else "A community."
        findings = [_clip(d, 30) for _n, _t, d in lines[:5]] if realistic else [f"{n} is a member." for n in names[:3]]
        return json.dumps({"title": f"Community of {names[0] if names else 'entities'}", "summary": summary,
                           "rating": 5, "rating_reason": f"{len(names)} entities listed", "findings": findings})
    return "An answer drawn from the context."


def tokens(text: str) -> int:
    """Tokens of ``text`` as OpenAI's servers count them for their models before gpt-4o (cl100k_base)."""
    from tasks.runtime.tokens import count_tokens

    return count_tokens(text)


def prompt_tokens_of(messages: list[dict]) -> int:
    """A chat prompt's tokens as OpenAI bills them: each message's content, 3 tokens a message, 3 for the reply."""
    return sum(tokens(m.get("content") or "") + 3 for m in messages) + 3


EMBEDDING_DIM = 64


def embedding_for(text: str) -> list[float]:
    """A deterministic bag-of-words vector (hashed words, unit norm): similar texts get similar vectors."""
    vec = [0.0] * EMBEDDING_DIM
    for word in re.findall(r"\w+", text.lower()):
        vec[int(hashlib.md5(word.encode()).hexdigest(), 16) % EMBEDDING_DIM] += 1.0
    norm = sum(v * v for v in vec) ** 0.5 or 1.0
    return [v / norm for v in vec]


class _Server(ThreadingHTTPServer):
    request_queue_size = 1024  # the default backlog of 5 drops SYNs when 100+ clients connect at once (1 s retransmits)


class FakeLLM:
    """Start with ``FakeLLM().start()``; ``url`` is the api_base; ``stop()`` shuts it down."""

    def __init__(self, latency_s: float = 0.0, seed: int = 0, hang_s: float = 5.0, realistic: bool = False,
                 **faults: float):
        self.latency_s = latency_s
        self.realistic = realistic  # answers of a model's length (``answer_for``)
        self.hang_s = hang_s
        self.faults = {"rate_limit": 0.0, "server_error": 0.0, "hang": 0.0, "malformed": 0.0, "empty": 0.0,
                       "bad_request": 0.0, **faults}
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.requests = 0
        self.injected: dict[str, int] = {k: 0 for k in self.faults}
        self.bad_bodies: list[str] = []
        self.answered: list[str] = []  # a digest of each chat prompt given a well-formed answer, in order
        self.prompt_tokens = 0  # prompt tokens of the chat requests answered (as the usage of each says)
        self.systems: list[str] = []  # the system message of each chat request answered
        self._server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def _pick_fault(self) -> str | None:
        with self.lock:
            self.requests += 1
            r = self.rng.random()
            acc = 0.0
            for name, p in self.faults.items():
                acc += p
                if r < acc:
                    self.injected[name] += 1
                    return name
        return None

    def start(self) -> FakeLLM:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # headers and body go out as separate writes: no 40 ms delayed-ACK stall

            def log_message(self, *args):  # quiet
                pass

            def _send(self, code: int, body: dict | str, headers: dict | None = None):
                data = (json.dumps(body) if isinstance(body, dict) else body).encode()
                try:
                    self.send_response(code)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    for k, v in (headers or {}).items():
                        self.send_header(k, v)
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def do_POST(self):
                length = int(self.headers.get("Content-Length", 0))
                payload = json.loads(self.rfile.read(length) or b"{}")
                if fake.latency_s:
                    time.sleep(fake.latency_s)
                fault = fake._pick_fault()
                if fault == "rate_limit":
                    return self._send(429, {"error": {"message": "slow down", "type": "rate_limit"}}, {"Retry-After": "0.2"})
                if fault == "server_error":
                    return self._send(500, {"error": {"message": "boom", "type": "server_error"}})
                if fault == "bad_request":
                    return self._send(400, {"error": {"message": "bad request", "type": "invalid_request_error"}})
                if fault == "hang":
                    time.sleep(fake.hang_s)
                if self.path.rstrip("/").endswith("/embeddings"):
                    texts = payload.get("input", [])
                    texts = [texts] if isinstance(texts, str) else texts
                    return self._send(200, {
                        "object": "list", "model": payload.get("model", "fake"),
                        "data": [{"object": "embedding", "index": i, "embedding": embedding_for(t)} for i, t in enumerate(texts)],
                        "usage": {"prompt_tokens": sum(map(tokens, texts)), "total_tokens": sum(map(tokens, texts))},
                    })
                messages = payload.get("messages", [])
                content = answer_for(messages, fake.realistic)
                if fault == "malformed":
                    content = f"MALFORMED-{fake.requests}: I'd rather not answer in JSON today."
                    fake.bad_bodies.append(content)
                elif fault == "empty":
                    content = ""
                else:
                    with fake.lock:
                        fake.answered.append(hashlib.sha256(json.dumps(messages, sort_keys=True).encode()).hexdigest())
                prompt_tokens = prompt_tokens_of(messages)
                with fake.lock:
                    fake.prompt_tokens += prompt_tokens
                    fake.systems.append(messages[0].get("content", "") if messages else "")
                body = {
                    "id": f"chatcmpl-{fake.requests}", "object": "chat.completion", "created": int(time.time()),
                    "model": payload.get("model", "fake"),
                    "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content}}],
                    "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": tokens(content),
                              "total_tokens": prompt_tokens + tokens(content)},
                }
                self._send(200, body)

        self._server = _Server(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server:
            self._server.shutdown()
            self._server.server_close()


def main() -> None:
    """``python -m tests.fake_llm_server --latency 0.2``: serve until killed; prints the api_base first."""
    import argparse

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--latency", type=float, default=0.0)
    ap.add_argument("--realistic", action="store_true", help="answers of a model's length (a cost measurement)")
    args = ap.parse_args()
    fake = FakeLLM(latency_s=args.latency, realistic=args.realistic).start()
    print(fake.url, flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()
