"""``moto_server`` with S3's conditional writes made atomic: ``python -m tests._moto_atomic -H HOST -p PORT``.

moto 5 answers a ``PUT`` with ``If-None-Match: *`` (or ``If-Match``) by checking for the key and
then storing it, without a lock, on a threaded server: two racing conditional puts of one key
can both succeed, where AWS S3 and MinIO let exactly one win. The exactly-once commit logs rely
on that guarantee (``ObjectStore.check`` refuses a store that ignores conditional puts
outright), and ``make test`` saw a racing-writers test lose a commit to it on a loaded machine.
This runs moto's own application as ``moto_server`` does, with every request that changes
something (PUT, POST, DELETE) holding one lock: reads stay concurrent.
"""

from __future__ import annotations

import argparse
import os
import threading
from collections.abc import Callable, Iterable
from typing import Any

from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
from werkzeug.serving import run_simple

_WRITES = frozenset({"PUT", "POST", "DELETE"})


class _AtomicWrites:
    def __init__(self, app: Callable[..., Iterable[bytes]]) -> None:
        self._app = app
        self._lock = threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("REQUEST_METHOD") not in _WRITES:
            return self._app(environ, start_response)
        with self._lock:
            return list(self._app(environ, start_response))  # the whole answer, under the lock


def main() -> None:
    parser = argparse.ArgumentParser(description="moto_server with atomic conditional writes")
    parser.add_argument("-H", "--host", default="127.0.0.1")
    parser.add_argument("-p", "--port", type=int, required=True)
    args = parser.parse_args()
    os.environ.setdefault("MOTO_PORT", str(args.port))  # as moto_server does: its URLs name the port
    app = DomainDispatcherApplication(create_backend_app)
    run_simple(args.host, args.port, _AtomicWrites(app), threaded=True, request_handler=MotoRequestHandler)


if __name__ == "__main__":
    main()
