"""An OTLP/HTTP logs receiver on loopback, the stand-in for a Collector in evaluation-event
tests: it decodes each ExportLogsServiceRequest it is sent and answers with `status`.

    with OtlpReceiver() as receiver:
        ... --evaluation-events-endpoint receiver.url ...
        receiver.wait_for_records(2)
"""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest


class OtlpReceiver(ThreadingHTTPServer):
    """Keeps (path, content type, decoded request) of each POST; answers `status` (200)."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.status = 200
        self.requests: list[tuple[str, str, ExportLogsServiceRequest]] = []
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1/logs"

    def log_records(self) -> list[Any]:
        """Every log record received so far, in order."""
        return [
            r
            for _, _, request in list(self.requests)
            for rl in request.resource_logs
            for sl in rl.scope_logs
            for r in sl.log_records
        ]

    def wait_for_records(self, n: int, timeout: float = 30.0) -> list[Any]:
        deadline = time.monotonic() + timeout
        while len(records := self.log_records()) < n:
            assert time.monotonic() < deadline, f"{len(records)} of {n} log records received"
            time.sleep(0.1)
        return records

    def __enter__(self) -> OtlpReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()
        self.server_close()


class _Handler(BaseHTTPRequestHandler):
    server: OtlpReceiver

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        request = ExportLogsServiceRequest.FromString(body)
        self.server.requests.append((self.path, self.headers["Content-Type"], request))
        self.send_response(self.server.status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass  # the test's output is for failures


def attributes(record: Any) -> dict[str, Any]:
    """A log record's attributes as a dict of plain values."""
    return {kv.key: getattr(kv.value, kv.value.WhichOneof("value")) for kv in record.attributes}
