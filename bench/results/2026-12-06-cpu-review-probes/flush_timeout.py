"""tracing.flush() claims to return within FLUSH_TIMEOUT_S (2 s). Against a collector that accepts and never
answers (a blackholed/overloaded OTLP endpoint), measure how long it blocks."""

import socket
import sys
import threading
import time

from app.ops import tracing

srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(16)
held = []


def accept():
    while True:
        c, _ = srv.accept()
        held.append(c)  # read nothing, answer nothing


threading.Thread(target=accept, daemon=True).start()
port = srv.getsockname()[1]
tracing.configure("otlp", f"http://127.0.0.1:{port}/v1/traces")
tracer = tracing._tracer
for i in range(int(sys.argv[1]) if len(sys.argv) > 1 else 10):
    tracer.start_span(f"s{i}").end()
t = time.monotonic()
tracing.flush()
print(f"FLUSH_TIMEOUT_S={tracing.FLUSH_TIMEOUT_S}; flush() took {time.monotonic() - t:.1f} s")
