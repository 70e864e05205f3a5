"""A real OpenAI-compatible judge endpoint on 127.0.0.1 for the judge verifier's tests: it reads
the two actions (their JSON, as `judge.action_json` writes them) out of the blocks of the judge
prompt that carry the request's tag, and answers by a rule on (A, B).

A rule answering "YES" or "NO" stands for a judge that follows the prompt: the endpoint sends
`VERDICT: YES` / `VERDICT: NO`. Any other answer, or any answer with `raw=True`, is sent as it
is (a judge that does not follow the format)."""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class FakeJudge:
    """A real OpenAI-compatible endpoint on 127.0.0.1 answering by a rule on (A, B)."""

    def __init__(self, rule, raw: bool = False):
        outer = self
        self.requests = 0
        self.prompts: list[str] = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests += 1
                if self.path != "/v1/chat/completions":
                    self.send_response(404)
                    self.end_headers()
                    return
                prompt = body["messages"][-1]["content"]
                outer.prompts.append(prompt)
                tag = re.match(r"The tag of this question is (\w+)\.", prompt).group(1)
                a, b = (re.search(f"^<<<{tag} ACTION {x}>>>\n(.*?)\n<<<{tag} END>>>$", prompt,
                                  re.S | re.M).group(1) for x in "AB")
                answer = rule(a, b)
                if answer in ("YES", "NO") and not raw:
                    answer = f"VERDICT: {answer}"
                reply = {"choices": [{"message": {"role": "assistant", "content": answer}}]}
                data = json.dumps(reply).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()
