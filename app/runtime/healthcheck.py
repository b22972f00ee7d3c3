"""The container's health check: exit 0 once GET /readyz answers 200 on this host, else 1.

    python3 -m app.runtime.healthcheck

Used by the image's HEALTHCHECK and docker-compose.yml (the image has no curl). Over https where
CGSERVE_TLS_CERT_FILE is set, without verifying the certificate (it names the public host, not
127.0.0.1). Under mutual TLS (CGSERVE_TLS_CLIENT_CA_FILE) the server asks for a client certificate
this check does not have: use a TCP check there instead (docs/security.md).
"""

from __future__ import annotations

import os
import ssl
import sys
import urllib.request


def main() -> int:
    tls = bool(os.environ.get("CGSERVE_TLS_CERT_FILE"))
    url = f"{'https' if tls else 'http'}://127.0.0.1:{os.environ.get('CGSERVE_PORT', '8000')}/readyz"
    context = ssl._create_unverified_context() if tls else None
    try:
        with urllib.request.urlopen(url, timeout=2, context=context) as answer:
            return 0 if answer.status == 200 else 1
    except OSError:  # refused, timed out, or an HTTP error status (503 while starting or draining)
        return 1


if __name__ == "__main__":
    sys.exit(main())
