"""The front door: a second HTTP port (and a gRPC one), served in C, for one image's uint8 pixels to the default
model, or to any other model of its images that a v2 infer or a gRPC call names.

    client ── POST /predict (raw uint8) ────▶ door.c: N epoll threads parse, check the token, copy the
      or POST /predict (a JPEG or PNG body)   pixels (an upload's bytes) into a bulk (a v2 request's JSON
      or POST /v2/models/<m>/infer            header beside them); the connection waits
         (binary extension, one UINT8 image)
      or gRPC ModelInfer (one UINT8 raw     ▶ grpc.c, in the same threads: HTTP/2 (nghttp2), the call's
         input) on the gRPC port              pixels into the bulk, its other fields beside them
                                                     │ eventfd: a bulk turned non-empty (or full)
                                                     ▼
                                              feeder.py on the event loop: takes the bulk (rows read in
                                              place), decodes its uploads over their rows (images.py), checks
                                              its v2 and gRPC headers, queues each model's rows (models.py)
                                              on that model's Batcher a bucket at a time
                                                     │ the batch's future
                                                     ▼
    client ◀── the service's own answer ───── the connection's own thread writes each answer (gRPC's:
                                              the gRPC port's ModelInferResponse, through nghttp2)

On a GPU the default model's POST /predict rows of raw pixels take a shorter way (CGSERVE_FRONT_DOOR_LAUNCHER, on
by default): the door thread copies them straight into a pinned slot of that model's engine, and launch.c's thread
launches the slot's captured graph through CUDA's driver and writes the answers, with no Python between a request
and its answer. Rows past its three slots go the feeder's way above. The seed CNN at 64 connections reached
0.82–1.02× of the 8-worker no-op that way on an H100, where the feeder's way reached 0.34–0.45×
(bench/results/2026-12-06-run57-h100-launcher-on.md).

Most clients send one image a request, as raw pixels or as Triton's clients and perf_analyzer send it (who
can be pointed at the door: it answers the v2 metadata GETs they read first). On the service's port each
such request costs Python a request's work (the ASGI protocol, the data plane, a future), and the H200
showed where that ends: the seed CNN at 64 connections over 8 workers reached 0.20× what uvicorn answers
with a no-op, where this design, with Python's work per bulk, reached 0.72×
(bench/results/2026-12-03-run34-h200-front-door.md).

It runs in the process that holds the engines (the server with one worker, or the engine process), so
that each model's one batcher sees every request for it, and only where front_door_port is set. Everything else (other
routes, models of other images, JSON, v2's JSON tensors, FP32 or encoded v2 images, multipart, chunked bodies, TLS)
is the service's ports': the door answers it a 4xx, or a gRPC status, that says so. It keeps its own limits
(door.c's and grpc.c's headers) and counts into the same metrics, under protocol "door" (format "raw",
"image", "v2-binary" or "grpc"). A JPEG or PNG body of at most one row's bytes is taken too and decoded as
the port decodes an upload, each decoder batch's rows queued as they are decoded (images.py); which path is the
faster for JPEG-heavy traffic, the door or the port with the engine process, is docs/api.md's to say.
gRPC on the door (run 38) answered perf_analyzer at 0.94–0.99× its v2 HTTP there, where grpcio's server in
Python held gRPC to 0.53–0.60× of the engine's peak (run 25).

    library.py     door.c, grpc.c and launch.c built (or the one the settings name)
    door.py        the C side through ctypes
    feeder.py      bulks onto their models' batchers, answers back: the flow control
    models.py      which model each row is for (POST /predict, a v2 path, a gRPC model_name), and its parts
    images.py      a bulk's JPEG and PNG uploads decoded over their own rows (the GPU decoder, Pillow)
    v2_headers.py  a v2 request's JSON header, checked by the HTTP port's codec once per distinct header
    grpc_calls.py  a gRPC call's request checked by the gRPC port's decode once per distinct request, its
                   ModelInferResponse from a template, the metadata calls' answers (loaded only with gRPC on)
    answers.py     each request's answer for a piece: /predict's JSON for k rows at once; v2's binary
                   outputs behind one JSON header built once, the rest row by row
    launcher.py    launch.c bound to the default model's engine (its launcher slots), its figures into the
                   metrics each second, bound again when the default model's version changes
    server.py      the port's life: opened once the models are ready, its v2 GET answers kept fresh,
                   drained and closed at shutdown
"""
