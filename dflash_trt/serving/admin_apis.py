"""Triton's administrative APIs, restricted to a key on both of its ports."""

from __future__ import annotations

import os
import re
import secrets

from dflash_trt.serving.triton_home import ServerError

# Triton's administrative APIs: any client of its HTTP or gRPC port could otherwise change the log settings
# (or point the log file elsewhere), start traces, register shared memory or load and unload models. They
# are always restricted: a request must carry the header ADMIN_KEY_HEADER with the admin key, which is
# ADMIN_KEY_ENV's value when set, else a random one (the APIs are then closed to everybody).
RESTRICTED_APIS = ("shared-memory", "logging", "trace", "model-repository")
ADMIN_KEY_HEADER = "dflash-admin-key"
GRPC_ADMIN_KEY_HEADER = "triton-grpc-protocol-" + ADMIN_KEY_HEADER  # gRPC metadata: Triton adds its prefix
ADMIN_KEY_ENV = "DFLASH_TRT_TRITON_ADMIN_KEY"


def admin_key_from_env() -> str:
    """ADMIN_KEY_ENV's value, else a fresh random key (the restricted APIs are then closed to everybody)."""
    return os.environ.get(ADMIN_KEY_ENV) or secrets.token_hex(16)


def restricted_api_options(key: str) -> list[str]:
    """Triton 2.51's flags restricting RESTRICTED_APIS to `key`: `--http-restricted-api` and (gRPC's spelling)
    `--grpc-restricted-protocol`, each `<api>,<api>:<header>=<value>`."""
    if not re.fullmatch(r"[A-Za-z0-9._~+/-]+", key):
        raise ServerError(f"{ADMIN_KEY_ENV}: the admin key may hold letters, digits and ._~+/- only")
    setting = f"{','.join(RESTRICTED_APIS)}:{ADMIN_KEY_HEADER}={key}"
    return [f"--http-restricted-api={setting}", f"--grpc-restricted-protocol={setting}"]
