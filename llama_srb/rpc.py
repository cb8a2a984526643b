"""llama.cpp's RPC backend: `rpc-server` workers on other machines as devices for the model.

Done as llama.cpp's own tools do it (`--rpc` in common/arg.cpp): each endpoint becomes a
backend registered with ggml, whose devices the model loader then uses like GPUs
(`--n-gpu-layers` offloads to them, `--tensor-split` weights them). Needs a llama-cpp-python
built with GGML_RPC (`make install` builds one).
"""

from __future__ import annotations

import ctypes
import logging
import socket
from collections.abc import Sequence

import llama_cpp

from llama_srb.native import ggml_library

log = logging.getLogger(__name__)


class RpcUnavailable(RuntimeError):
    pass


def add_rpc_servers(endpoints: Sequence[str]) -> list[str]:
    """Registers each `host:port` as a backend before the model loads; returns the devices
    that came with them (one or more per worker), as llama.cpp describes them."""
    if not llama_cpp.llama_supports_rpc():
        raise RpcUnavailable(
            "this llama-cpp-python has no RPC backend: `make install` builds one with"
            " GGML_RPC (see the README's Scaling out section)"
        )
    ggml = ggml_library()
    rpc = ggml.ggml_backend_reg_by_name(b"RPC")
    address = ggml.ggml_backend_reg_get_proc_address(rpc, b"ggml_backend_rpc_add_server")
    if not rpc or not address:
        raise RpcUnavailable("llama.cpp's RPC backend has no ggml_backend_rpc_add_server")
    add_server = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p)(address)
    devices = []
    check_reachable(endpoints)  # llama.cpp aborts the process on one it cannot reach
    for endpoint in endpoints:
        reg = add_server(endpoint.encode())
        if not reg:
            raise RpcUnavailable(f"cannot reach the rpc-server at {endpoint}")
        ggml.ggml_backend_register(reg)
        for i in range(ggml.ggml_backend_reg_dev_count(reg)):
            description = ggml.ggml_backend_dev_description(ggml.ggml_backend_reg_dev_get(reg, i))
            devices.append(f"{endpoint}: {description.decode(errors='replace')}")
    log.info("RPC devices: %s", "; ".join(devices))
    return devices


def check_reachable(endpoints: Sequence[str]) -> None:
    for endpoint in endpoints:
        host, _, port = endpoint.rpartition(":")
        if not host or not port.isdigit():
            raise RpcUnavailable(f"an RPC endpoint is host:port, got {endpoint!r}")
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=5).close()
        except OSError as exc:
            raise RpcUnavailable(f"cannot reach the rpc-server at {endpoint}: {exc}") from exc
