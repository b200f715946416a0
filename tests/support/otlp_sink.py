"""An OTLP/HTTP trace receiver for tests: accepts POST /v1/traces with a JSON
body, parses it strictly with the official protobuf definitions
(`opentelemetry-proto`: `json_format.Parse` into `ExportTraceServiceRequest`,
which refuses unknown fields and ill-typed values), and appends every span it
received to FILE as one JSON line:

  {"name", "kind", "traceId", "spanId", "parentSpanId", "start", "end",
   "service", "attributes": {key: value}}

A body that does not parse is answered 400 and written as {"error": "..."}
so that the test sees why. Prints "READY <port>" once it listens.

usage: otlp_sink.py FILE PORT   (PORT 0 picks a free port)
"""
import base64
import json
import re
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

LOCK = threading.Lock()
HEX = re.compile(r"^[0-9a-f]*$")


def hex_id(raw, length):
    """OTLP/JSON writes trace and span ids as hex, where the generic protobuf
    JSON mapping expects base64 for bytes. Hex digits are base64 digits too,
    so Parse decoded the text as base64: encoding the bytes again gives the
    text back, which must then be `length` lowercase hex digits."""
    text = base64.b64encode(raw).decode() if raw else ""
    if text and (len(text) != length or not HEX.match(text)):
        raise ValueError(f"id {text!r} is not {length} lowercase hex digits")
    return text


def any_value(v):
    kind = v.WhichOneof("value")
    if kind == "string_value":
        return v.string_value
    if kind == "int_value":
        return v.int_value
    if kind == "bool_value":
        return v.bool_value
    if kind == "double_value":
        return v.double_value
    raise ValueError(f"unexpected attribute value type {kind}")


def spans_of(body):
    req = ExportTraceServiceRequest()
    json_format.Parse(body, req)
    out = []
    for rs in req.resource_spans:
        resource = {a.key: any_value(a.value) for a in rs.resource.attributes}
        for ss in rs.scope_spans:
            for s in ss.spans:
                if len(s.trace_id) == 0 or len(s.span_id) == 0:
                    raise ValueError(f"span {s.name!r} lacks a trace or span id")
                if s.start_time_unix_nano == 0 or s.end_time_unix_nano < s.start_time_unix_nano:
                    raise ValueError(f"span {s.name!r} has bad times")
                out.append(
                    {
                        "name": s.name,
                        "kind": s.kind,
                        "traceId": hex_id(s.trace_id, 32),
                        "spanId": hex_id(s.span_id, 16),
                        "parentSpanId": hex_id(s.parent_span_id, 16),
                        "start": s.start_time_unix_nano,
                        "end": s.end_time_unix_nano,
                        "service": resource.get("service.name"),
                        "attributes": {a.key: any_value(a.value) for a in s.attributes},
                    }
                )
    return out


class Handler(BaseHTTPRequestHandler):
    out_path = None

    def log_message(self, *args):
        pass

    def answer(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        try:
            if self.path != "/v1/traces":
                raise ValueError(f"POST to {self.path}, not /v1/traces")
            ctype = self.headers.get("Content-Type", "")
            if ctype.split(";")[0].strip() != "application/json":
                raise ValueError(f"Content-Type {ctype!r}, not application/json")
            lines = [json.dumps(s) for s in spans_of(body)]
        except Exception as e:  # noqa: BLE001 - every failure is reported to the test
            lines = [json.dumps({"error": f"{type(e).__name__}: {e}"})]
            code, answer = 400, {"error": str(e)}
        else:
            code, answer = 200, {}
        with LOCK, open(self.out_path, "a") as f:
            f.write("".join(line + "\n" for line in lines))
        self.answer(code, answer)


def main():
    out_path, port = sys.argv[1], int(sys.argv[2])
    Handler.out_path = out_path
    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    print(f"READY {server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
