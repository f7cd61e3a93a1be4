"""``mtp-bindings rpc-server``: ggml's ``rpc-server``, bundled with the package, so that a worker of
a multi-machine setup needs nothing but ``pip install mtp-bindings``.

One job: find the bundled binary and run it in this process's place with the user's flags, which
are rpc-server's own (``-H`` host, ``-p`` port, ``-t`` threads, ``-d`` devices, ``-c`` cache; ``-h``
its help), after saying where it will listen and how a client uses it. Clients add it with
``--rpc HOST:PORT`` (see :func:`mtp_bindings.native.devices.add_rpc_servers`).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from ..native._backends import is_portable
from ..config.params import RPC_SERVER_HOST, RPC_SERVER_PORT
from .flags import PROG, CLIError
from .interrupt import Interrupt

BINARY = "rpc-server"


def rpc_server_path() -> Path:
    """The bundled ``rpc-server`` (``mtp_bindings/bin``, next to the compiled module)."""
    cands = [Path(__file__).resolve().parent.parent / "bin" / BINARY, Path(__file__).parent.parent / "bin" / BINARY]
    # found, not imported: the compiled module is not needed to start a program
    spec = importlib.util.find_spec("mtp_bindings._ffi")
    if spec is not None and spec.origin:
        cands.append(Path(spec.origin).resolve().parent / "bin" / BINARY)
    return next((c for c in cands if c.is_file()), cands[0])


def listen_address(argv: Sequence[str]) -> tuple[str, str]:
    """The host and port rpc-server will bind with ``argv`` (its -H / -p, the last one given; its
    defaults otherwise). Read only to say so: rpc-server checks its flags itself."""
    host, port = RPC_SERVER_HOST, str(RPC_SERVER_PORT)
    for i, a in enumerate(argv[:-1]):
        if a in ("-H", "--host"):
            host = argv[i + 1]
        elif a in ("-p", "--port"):
            port = argv[i + 1]
    return host, port


def cmd_rpc_server(args: argparse.Namespace, interrupt: Interrupt) -> int:
    """Replace this process with the bundled rpc-server (signals, Ctrl-C and the exit status are then its)."""
    exe = rpc_server_path()
    if not exe.is_file():
        raise CLIError(f"this install has no {BINARY} (looked for {exe}; it is built unless MTP_BUILD_RPC_SERVER=OFF)")
    argv = list(args.rpc_args)
    if not {"-h", "--help"} & set(argv):
        host, port = listen_address(argv)
        where = "<this machine's address>" if host in ("0.0.0.0", "::") else host
        print(f"{PROG}: rpc-server listens on {host}:{port}; clients use it with --rpc {where}:{port} -ngl 99 "
              "(no authentication: keep it on a trusted network)", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    # rpc-server registers ggml's backends itself, looking beside its executable and in the working
    # directory; a portable install (a wheel) has them as modules in lib/, beside libllama, so it
    # starts there (it takes no relative path: its -c cache lives under ~/.cache)
    lib_dir = exe.parent.parent / "lib"
    if is_portable(lib_dir):
        os.chdir(lib_dir)
    os.execv(exe, [str(exe), *argv])
    return 0  # not reached: execv returns only by raising OSError
