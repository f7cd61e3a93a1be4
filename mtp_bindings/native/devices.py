"""Where a model's layers go: the ggml devices a build offers, and a ``--device`` list as the
NULL-terminated device array ``llama_model_params.devices`` takes.

One job: llama.cpp's ``--device`` rule in Python. Names are the backends' (``CUDA0``, ``Metal``,
``Vulkan1``, ...), matched case-insensitively; ``none`` offloads to no device; the CPU is not a
device to offload to (it holds whatever is not offloaded). A CPU-only build has no such device, so
there only ``none`` (or no list: all devices, i.e. none) is valid.

And llama.cpp's ``--rpc``: :func:`add_rpc_servers` adds the devices of ggml ``rpc-server`` workers
(``RPC0``, ``RPC1``, ...), which then take layers like GPUs do (``n_gpu_layers``); ggml's own
failures there abort the process, so each server is checked here first, within a time limit.
"""

from __future__ import annotations

import logging
import socket
import struct
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from . import _native
from ._native import ffi, lib
from ..exceptions import InvalidParameterError, RPCServerError
from ..config.params import RPC_TIMEOUT_S

logger = logging.getLogger("mtp_bindings")

NO_DEVICE = "none"


def offload_devices() -> list[tuple[str, Any]]:
    """``(name, ggml_backend_dev_t)`` of each device a model can be offloaded to (not the CPU)."""
    _native.ensure_initialised()
    out = []
    for i in range(int(lib.ggml_backend_dev_count())):
        dev = lib.ggml_backend_dev_get(i)
        if lib.ggml_backend_dev_type(dev) != lib.GGML_BACKEND_DEVICE_TYPE_CPU:
            out.append((ffi.string(lib.ggml_backend_dev_name(dev)).decode(), dev))
    return out


@dataclass(frozen=True)
class DeviceInfo:
    """A device a model's layers can go to, as llama.cpp's ``--list-devices`` shows it."""

    name: str          # what ``devices=`` / ``--device`` takes: ``Vulkan0``, ``CUDA1``, ``RPC0``, ...
    description: str   # the backend's words for it (``NVIDIA H200``, ``llvmpipe (LLVM 15.0.6, 256 bits)``)
    free_bytes: int | None   # None for an RPC server's device: asking would reach the server
    total_bytes: int | None


def list_devices() -> list[DeviceInfo]:
    """Every device this build and process can offload to (the CPU is not one: it holds the rest).
    A CPU-only build lists none; RPC servers' devices appear once added (:func:`add_rpc_servers`), without
    their memory: ggml asks the server for it and aborts the process when the server has gone."""
    out = []
    for name, dev in offload_devices():
        free: int | None = None
        total: int | None = None
        if not _is_rpc(dev):
            f, t = ffi.new("size_t *"), ffi.new("size_t *")
            lib.ggml_backend_dev_memory(dev, f, t)
            free, total = int(f[0]), int(t[0])
        out.append(DeviceInfo(name, ffi.string(lib.ggml_backend_dev_description(dev)).decode(errors="replace"),
                              free, total))
    return out


def _is_rpc(dev: Any) -> bool:
    """Whether ``dev`` is an RPC server's device (registered by :func:`add_rpc_servers`)."""
    return ffi.string(lib.ggml_backend_reg_name(lib.ggml_backend_dev_backend_reg(dev))).decode() == RPC_REGISTRY


def parse_device_list(devices: str | Sequence[str]) -> list[str]:
    """``"CUDA0,CUDA1"`` or a list of names -> the names (``[]`` for ``none``), unchecked."""
    names = [d.strip() for d in (devices.split(",") if isinstance(devices, str) else devices)]
    if any(not isinstance(d, str) or not d for d in names) or not names:
        raise InvalidParameterError(f"devices must be device names or 'none', got {devices!r}")
    if [d.lower() for d in names] == [NO_DEVICE]:
        return []
    if NO_DEVICE in (d.lower() for d in names):
        raise InvalidParameterError("devices: 'none' cannot be combined with device names")
    return names


def _null_terminated(devs: Sequence[Any]) -> Any:
    """``devs`` as the NULL-terminated ``ggml_backend_dev_t[]`` llama.cpp's params take."""
    arr = ffi.new("ggml_backend_dev_t[]", len(devs) + 1)
    for i, dev in enumerate(devs):
        arr[i] = dev
    arr[len(devs)] = ffi.NULL
    return arr


def device_array(devices: str | Sequence[str]) -> Any:
    """The NULL-terminated ``ggml_backend_dev_t[]`` for ``devices`` (keep it alive while the
    params are used); an unknown name is an :class:`InvalidParameterError` listing the known ones."""
    names = parse_device_list(devices)
    found = offload_devices()
    by_name = {name.lower(): dev for name, dev in found}
    for name in names:
        if name.lower() not in by_name:
            known = ", ".join(n for n, _ in found) or "none: this build has no GPU backend"
            raise InvalidParameterError(f"devices: unknown device {name!r} (available: {known})")
    return _null_terminated([by_name[name.lower()] for name in names])


# --- RPC servers: another machine's devices over TCP (ggml's RPC backend, llama.cpp's --rpc) ------

RPC_REGISTRY = "RPC"
# ggml-rpc's wire protocol as the pinned llama.cpp speaks it (ggml-rpc.h, ggml-rpc.cpp), spoken here
# once before ggml connects: ggml aborts the whole process on an endpoint it cannot parse, a server
# it cannot reach or a failed handshake, and waits without a timeout for a server that accepts but
# does not answer (one busy with another client: an rpc-server serves one client at a time).
_RPC_CMD_HELLO = 14
_RPC_CONN_CAPS_SIZE = 24  # all zero: plain TCP, no RDMA offered
_RPC_PROTO = (7, 0)       # RPC_PROTO_MAJOR_VERSION, RPC_PROTO_MINOR_VERSION (a server's minor may not be newer)
_HELLO_REQUEST = struct.pack("<BQ", _RPC_CMD_HELLO, _RPC_CONN_CAPS_SIZE) + bytes(_RPC_CONN_CAPS_SIZE)
_HELLO_RESPONSE_SIZE = 4 + _RPC_CONN_CAPS_SIZE  # major, minor, patch, padding, the server's caps

_rpc_lock = threading.Lock()
# endpoint -> the names of the devices it added (ggml registers an endpoint once per process and
# keeps its connection: it is never registered, nor probed, again)
_rpc_endpoints: dict[str, tuple[str, ...]] = {}
# (IPv4 address, port) -> the endpoint registered for it: a second spelling of one server would open
# a second connection to it, which it would not serve while the first is open
_rpc_addresses: dict[tuple[str, int], str] = {}


def parse_rpc_servers(servers: str | Sequence[str]) -> list[str]:
    """``"host1:50052,host2:50052"`` or a list of ``HOST:PORT`` -> the endpoints, normalised
    (``host:port``); malformed is an :class:`InvalidParameterError`. Hosts are names or IPv4
    addresses: ggml's RPC client splits at the first ``:`` and connects over IPv4 only."""
    items = servers.split(",") if isinstance(servers, str) else list(servers) if isinstance(servers, Sequence) else []
    if not items or any(not isinstance(s, str) for s in items):
        raise InvalidParameterError(f"rpc_servers must be HOST:PORT[,HOST:PORT...], got {servers!r}")
    out: list[str] = []
    for item in (s.strip() for s in items):
        host, sep, port = item.partition(":")
        if not sep or not host or not (port.isascii() and port.isdigit()) or not 0 < int(port) <= 65535:
            raise InvalidParameterError(f"rpc_servers: {item!r} is not HOST:PORT (a host name or IPv4 address, "
                                        "a port in 1..65535)")
        endpoint = f"{host}:{int(port)}"
        if endpoint in out:
            raise InvalidParameterError(f"rpc_servers: {endpoint} is listed twice")
        out.append(endpoint)
    return out


def _resolve(endpoint: str, deadline: float) -> tuple[str, int]:
    """``endpoint``'s (IPv4 address, port), as ggml will connect to it; the lookup is bounded by
    ``deadline`` (a resolver can take far longer: it runs on a thread that is then left behind)."""
    host, _, port = endpoint.partition(":")
    found: list[Any] = []

    def lookup() -> None:
        try:
            found.append(socket.getaddrinfo(host, int(port), socket.AF_INET, socket.SOCK_STREAM))
        except OSError as e:
            found.append(e)

    worker = threading.Thread(target=lookup, name=f"resolve {host}", daemon=True)
    worker.start()
    worker.join(max(0.0, deadline - time.monotonic()))
    if not found:
        raise RPCServerError(f"RPC server {endpoint}: resolving {host!r} took too long")
    if isinstance(found[0], OSError) or not found[0]:
        raise RPCServerError(f"RPC server {endpoint}: cannot resolve {host!r} to an IPv4 address ({found[0]})")
    return found[0][0][4][0], int(port)


def _recv_exact(sock: socket.socket, n: int, deadline: float) -> bytes:
    data = b""
    while len(data) < n:
        sock.settimeout(max(0.001, deadline - time.monotonic()))
        chunk = sock.recv(n - len(data))
        if not chunk:
            break
        data += chunk
    return data


def _probe(endpoint: str, address: tuple[str, int], deadline: float, timeout: float) -> None:
    """Connect to the rpc-server at ``address`` and exchange the protocol's hello by ``deadline``
    (``time.monotonic()``, ``timeout`` after the start); raise :class:`RPCServerError` saying what
    went wrong. The connection is closed after: the server then waits for its next client, ggml's."""
    try:
        with socket.create_connection(address, timeout=max(0.001, deadline - time.monotonic())) as sock:
            sock.sendall(_HELLO_REQUEST)
            head = _recv_exact(sock, 8, deadline)
            size = struct.unpack("<Q", head)[0] if len(head) == 8 else None
            body = _recv_exact(sock, _HELLO_RESPONSE_SIZE, deadline) if size == _HELLO_RESPONSE_SIZE else b""
    except ConnectionRefusedError:
        raise RPCServerError(f"RPC server {endpoint}: connection refused (is `mtp-bindings rpc-server` running "
                             "there, on that port and an address this machine can reach?)") from None
    except TimeoutError:
        raise RPCServerError(f"RPC server {endpoint}: no answer within {timeout:g} s (unreachable, busy with another "
                             "client -- an rpc-server serves one client at a time -- or not an rpc-server)") from None
    except OSError as e:
        raise RPCServerError(f"RPC server {endpoint}: cannot connect ({e.strerror or e})") from None
    if len(body) != _HELLO_RESPONSE_SIZE:
        raise RPCServerError(f"RPC server {endpoint}: no valid answer to the protocol's hello (not an rpc-server, or "
                             f"one of another protocol version; this build speaks {_RPC_PROTO[0]}.{_RPC_PROTO[1]})")
    major, minor, patch = body[0], body[1], body[2]
    if major != _RPC_PROTO[0] or minor > _RPC_PROTO[1]:
        raise RPCServerError(f"RPC server {endpoint} speaks RPC protocol {major}.{minor}.{patch}, this build "
                             f"{_RPC_PROTO[0]}.{_RPC_PROTO[1]}: run the same mtp-bindings version on both sides")


def _rpc_add_server() -> Any:
    """ggml's ``ggml_backend_rpc_add_server``, found through the RPC registry (it is not exported)."""
    fn = _native.registry_function(RPC_REGISTRY, "ggml_backend_rpc_add_server", "ggml_backend_reg_t (*)(const char *)")
    if fn is None:
        raise RPCServerError("this build of llama.cpp has no RPC backend (GGML_RPC)")
    return fn


def _register(endpoint: str, timeout: float) -> tuple[str, ...]:
    """Probe ``endpoint``, then let ggml connect and register its devices (caller holds the lock)."""
    deadline = time.monotonic() + timeout
    address = _resolve(endpoint, deadline)
    if address in _rpc_addresses:
        raise InvalidParameterError(f"rpc_servers: {endpoint} is the server already added as "
                                    f"{_rpc_addresses[address]} (use that name: a server takes one connection)")
    _probe(endpoint, address, deadline, timeout)
    # the server answered just now; should it go away before ggml's own connection, ggml aborts
    reg = _rpc_add_server()(endpoint.encode())
    if reg == ffi.NULL:
        raise RPCServerError(f"RPC server {endpoint} offers no device")
    lib.ggml_backend_register(reg)
    names = tuple(ffi.string(lib.ggml_backend_dev_name(lib.ggml_backend_reg_dev_get(reg, i))).decode()
                  for i in range(int(lib.ggml_backend_reg_dev_count(reg))))
    _rpc_addresses[address] = endpoint
    logger.info("RPC server %s: device%s %s", endpoint, "s" if len(names) != 1 else "", ", ".join(names))
    return names


def add_rpc_servers(servers: str | Sequence[str], *, timeout: float = RPC_TIMEOUT_S) -> list[str]:
    """Register the RPC servers ``servers`` (``"host1:50052,host2:50052"`` or a list) with ggml,
    each endpoint once per process, and return the names of their devices in order (``RPC0``,
    ``RPC1``, ...: ggml numbers them in the order servers are first added).

    An endpoint is probed first (resolve, connect, the protocol's hello), all within ``timeout``
    seconds: a malformed endpoint is an :class:`InvalidParameterError`; one that cannot be
    resolved, refuses, does not answer in time, speaks another protocol version or offers no
    device is an :class:`RPCServerError`. An endpoint already added is neither probed nor added
    again (ggml keeps its connection open, and a server serves one client at a time).
    """
    endpoints = parse_rpc_servers(servers)
    if not (isinstance(timeout, (int, float)) and not isinstance(timeout, bool) and timeout > 0):
        raise InvalidParameterError(f"timeout must be a positive number of seconds, got {timeout!r}")
    _native.ensure_initialised()
    names: list[str] = []
    with _rpc_lock:
        for endpoint in endpoints:
            if endpoint not in _rpc_endpoints:
                _rpc_endpoints[endpoint] = _register(endpoint, timeout)
            names.extend(_rpc_endpoints[endpoint])
    return names


def _local_default_devices() -> list[Any]:
    """The devices llama.cpp's default selection takes besides RPC ones: the GPUs, else the
    integrated GPUs of one backend (its de-duplication of one GPU seen by two backends is left out:
    this list is used only once RPC servers are registered)."""
    gpus: list[Any] = []
    igpus: list[Any] = []
    for _, dev in offload_devices():
        kind = lib.ggml_backend_dev_type(dev)
        reg = lib.ggml_backend_dev_backend_reg(dev)
        if kind == lib.GGML_BACKEND_DEVICE_TYPE_GPU and not _is_rpc(dev):
            gpus.append(dev)
        elif kind == lib.GGML_BACKEND_DEVICE_TYPE_IGPU and (
                not igpus or reg == lib.ggml_backend_dev_backend_reg(igpus[-1])):
            igpus.append(dev)
    return gpus or igpus


def placement_array(devices: str | Sequence[str] | None, rpc_devices: Sequence[str] = ()) -> Any:
    """What ``llama_model_params.devices`` gets for a model (keep it alive while the params are used):
    ``devices`` when given (see :func:`device_array`; RPC devices by name too). Else ``None`` -- llama.cpp's
    default, every device -- unless this process has added RPC servers: then the model's own RPC
    devices (``rpc_devices``, first, as llama.cpp puts them) and the local GPUs, so that a model
    loaded without ``rpc_servers`` does not use the servers another model was given."""
    if devices is not None:
        return device_array(devices)
    with _rpc_lock:
        any_rpc = bool(_rpc_endpoints)
    if not any_rpc:
        return None
    by_name = dict(offload_devices())
    return _null_terminated([by_name[name] for name in rpc_devices] + _local_default_devices())
