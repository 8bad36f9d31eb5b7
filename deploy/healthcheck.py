"""The image's health check: ``web`` (the sign-in page answers) or ``worker QUEUE`` (this container's Celery
node, ``QUEUE@<hostname>``, answers a ping through the broker).

    python /usr/local/bin/agentfly-healthcheck web
    python /usr/local/bin/agentfly-healthcheck worker cpu
"""

from __future__ import annotations

import os
import socket
import sys
import urllib.request


def web() -> None:
    port = os.environ.get("PORT", "8000")
    urllib.request.urlopen(f"http://127.0.0.1:{port}/login/", timeout=4).read(1)  # raises unless 2xx


def worker(queue: str) -> None:
    import django

    django.setup()
    from webapp.celery import app

    node = f"{queue}@{socket.gethostname()}"
    if not app.control.ping([node], timeout=5):
        sys.exit(f"celery node {node} did not answer a ping")


if __name__ == "__main__":
    role = sys.argv[1] if len(sys.argv) > 1 else "web"
    if role == "web":
        web()
    elif role == "worker" and len(sys.argv) == 3:
        worker(sys.argv[2])
    else:
        sys.exit("usage: agentfly-healthcheck web | worker QUEUE")
