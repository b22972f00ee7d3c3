"""One engine process for the whole service (CGSERVE_ENGINE_PROCESS=true, with CGSERVE_WORKERS).

Per-process engines give each HTTP worker its own CUDA context, graphs and batcher: with N
workers the GPU time-slices N contexts and each batcher sees only 1/N of the requests, so its
batches stay small. Here the workers keep the HTTP path (parsing, decoding, encoding) and one
engine process holds every engine and one batcher per model:

    HTTP worker ──(requests' images into a /dev/shm segment; a 49-byte frame on a Unix socket)──▶ engine process
                ◀──(their probabilities, or the error, in a frame)──────────────────────────

The engine process also decodes JPEG uploads on its GPU: a worker sends a request's JPEGs as they
came (UPLOADS frames), they are decoded and inferred there, and the scores come back as for pixels.
It runs model control too: a load or unload made there reaches every worker as a new table of
served (model, version)s.

- frames.py: the wire format of the socket.
- segments.py: the shared-memory segments a worker writes its requests' pixels into.
- host.py: the engine process: the service's engines and batchers behind the socket.
- client.py: what a worker's routes call instead of a local batcher.
"""

SOCKET_ENV = "CGSERVE_ENGINE_SOCKET"  # set for the workers by app/runtime/workers.py: where the engine process listens
SEGMENTS_ENV = "CGSERVE_ENGINE_SEGMENTS"  # the folder of the workers' shared-memory segments
