"""Access control and request tracing: bearer tokens, CORS, X-Request-ID, a JSON access log.

Everything here is off by default; app/access/middleware.py adds only what the settings turn on.
This package's __init__ imports nothing: app/config.py imports app.access.tokens for its types.
"""
