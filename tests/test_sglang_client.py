"""The SGLang client checks every streamed /generate chunk: a server answering something
else gets one ServerError sentence, never a traceback or a made-up figure."""
from __future__ import annotations

import http.server
import json
import threading

import pytest

from mtplab.sglang.client import ServerError, generate_one

GOOD = {"output_ids": [5, 6], "meta_info": {"completion_tokens": 2, "spec_verify_ct": 1}}


@pytest.fixture
def stub():
    """A server whose /generate streams `stub.chunks` (JSON texts) then [DONE]."""
    chunks: list[str] = []

    class H(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for c in chunks:
                self.wfile.write(b"data: " + c.encode() + b"\n\n")
            self.wfile.write(b"data: [DONE]\n\n")

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    server.chunks = chunks
    server.base = f"http://127.0.0.1:{server.server_address[1]}"
    yield server
    server.shutdown()
    server.server_close()


def test_a_well_formed_stream_is_read(stub):
    stub.chunks[:] = [json.dumps({"output_ids": [5], "meta_info": {"completion_tokens": 1}}),
                      json.dumps(GOOD)]
    st = generate_one(stub.base, [1, 2, 3], 2)
    assert st.tokens == 2 and st.output_ids == [5, 6] and st.verify_ct == 1


@pytest.mark.parametrize("chunk,message", [
    ("[1, 2, 3]", "a JSON list where an object belongs"),
    ("null", "a JSON null where an object belongs"),
    ('"text"', "a JSON str where an object belongs"),
    ('{"meta_info": null}', "meta_info is None, not an object"),
    ('{"meta_info": {"completion_tokens": "3"}}',
     "meta_info.completion_tokens is '3', not a count"),
    ('{"meta_info": {"completion_tokens": -1}}', "meta_info.completion_tokens is -1"),
    ('{"meta_info": {"completion_tokens": 2, "spec_verify_ct": "x"}}',
     "meta_info.spec_verify_ct is 'x'"),
    ('{"output_ids": null, "meta_info": {"completion_tokens": 1}}', "output_ids is None"),
    ('{"output_ids": [1, "2"], "meta_info": {"completion_tokens": 2}}', "output_ids is [1, '2']"),
    ('{"output_ids": [1, true], "meta_info": {"completion_tokens": 2}}', "not a list of token"),
    ("{not json", "JSONDecodeError"),
], ids=lambda v: v[:24])
def test_a_malformed_chunk_is_one_server_error(stub, chunk, message):
    stub.chunks[:] = [json.dumps(GOOD), chunk]
    with pytest.raises(ServerError) as e:
        generate_one(stub.base, [1, 2, 3], 2)
    text = str(e.value)
    assert message in text and "\n" not in text and f"{stub.base}/generate" in text, text


def test_health_polling_reads_a_malformed_answer_as_not_yet(monkeypatch):
    """A poll before the server listens can connect to itself (a loopback port in the
    ephemeral range) and read back its own request as the status line: not yet healthy."""
    import http.client
    import io

    from mtplab.sglang import client

    class Ok(io.BytesIO):
        status = 200

    answers = iter([http.client.BadStatusLine("GET /health HTTP/1.1"),
                    ConnectionRefusedError(), Ok()])

    def urlopen(url, timeout):
        a = next(answers)
        if isinstance(a, Exception):
            raise a
        return a
    monkeypatch.setattr(client.urllib.request, "urlopen", urlopen)
    client.wait_healthy("http://127.0.0.1:1", timeout_s=5.0, poll_s=0.0)
    with pytest.raises(StopIteration):
        next(answers)
