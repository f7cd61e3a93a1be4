"""Running the app under uvicorn until Ctrl-C or SIGTERM (``mtp-bindings serve``).

One job: start uvicorn on the app and stop it well: on shutdown every generation is cancelled
at once (queued or running) and each open request is answered with a 503
``server_shutting_down`` error before uvicorn waits for the connections. The listening socket
can be bound first (:func:`bind_socket`), before the model loads, so that a port already in use
fails in a second with a clear message rather than after the load in uvicorn's words.
"""

from __future__ import annotations

import errno
import socket
from collections.abc import Callable
from typing import Any

from ..exceptions import InvalidParameterError, MTPBindingsError
from .app import create_app

# seconds uvicorn waits for open connections at shutdown (generations are cancelled at once, so
# this only bounds a client that does not read its response)
GRACEFUL_SHUTDOWN_S = 5


def bind_socket(host: str = "127.0.0.1", port: int = 8080) -> socket.socket:
    """A socket bound to ``host:port`` for :func:`serve` (``sock=``), or an
    :class:`InvalidParameterError` saying why not (the port in use, the address not this
    machine's, ...)."""
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise InvalidParameterError(f"port must be an int in 0..65535, got {port!r}")
    # as uvicorn binds: IPv6 when the host is an IPv6 address, else IPv4
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a restart may reuse the port at once
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            raise InvalidParameterError(f"port {port} on {host} is already in use (another server listens there); "
                                        f"stop it or pick another port (--port)") from None
        raise InvalidParameterError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    sock.set_inheritable(True)
    return sock


def serve(
    model: Any,
    *,
    host: str = "127.0.0.1",
    port: int = 8080,
    model_name: str | None = None,
    log_level: str = "info",
    access_log: bool = False,
    sock: socket.socket | None = None,
    **app_kwargs: Any,
) -> None:
    """Serve ``model`` until interrupted (blocking; Ctrl-C or SIGTERM stops it, answering open
    requests with a 503 error, see the module's docstring). ``app_kwargs`` go to
    :func:`create_app`; ``model_name`` defaults to the target file's stem. Binds loopback unless
    ``host`` says otherwise; ``sock``: a socket from :func:`bind_socket` to listen on instead
    (``host``/``port`` then only name it in the log)."""
    import uvicorn

    if sock is None:
        sock = bind_socket(host, port)  # before the app: a port in use fails before its contexts exist
    name = model_name or model.path.stem
    try:
        app = create_app(model, model_name=name, **app_kwargs)
        config = uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=access_log,
                                timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S)
        server = _stopping_server_class()(config, app.state.server.abort_requests)
        server.run(sockets=[sock])
    except KeyboardInterrupt:  # uvicorn re-raises the signal that stopped it, once it has stopped
        pass
    finally:
        sock.close()
    if not server.started:
        raise MTPBindingsError(f"the server did not start on {host}:{port} (see the log above)")


def _stopping_server_class() -> type:
    """uvicorn's ``Server``, made to cancel the generations before it waits for their connections
    (uvicorn would wait up to its graceful timeout, then cut them with a bare 500)."""
    import uvicorn

    class StoppingServer(uvicorn.Server):
        def __init__(self, config: Any, on_shutdown: Callable[[], None]) -> None:
            super().__init__(config)
            self._on_shutdown = on_shutdown

        async def shutdown(self, sockets: Any = None) -> None:
            self._on_shutdown()
            await super().shutdown(sockets=sockets)

    return StoppingServer
