"""`ServerConfig`: the sampler server's settings, checked when built."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 0  # 0 = pick a free port
    token: str | None = None
    tls_cert: str | None = None  # PEM paths; both or neither
    tls_key: str | None = None
    max_message_bytes: int = 64 << 20
    max_prompts: int = 4096
    staging_root: str | None = None
    data_port: int | None = None  # push data plane (raw TCP, never with TLS): None off, 0 any port
    data_wait_s: float = 10.0  # how long a socket-plane push waits for its data connection
    data_auth_timeout_s: float = 5.0  # a data connection must send its full preamble within this
    data_max_pending: int = 64  # data connections awaiting their preamble or their push, at most
    push_idle_timeout_s: float = 60.0  # a push whose stream (or data socket) is silent this long
    push_max_s: float = 900.0  # a push taking longer in all (lock wait included) is discarded
    staging_reserve_bytes: int = 64 << 20  # free space a staged push must leave on its filesystem
    # "memory": mapped staging file, checks overlapped with receiving, the engine (JAX backend)
    # loading each verified tensor as the next arrives; "file": the engine loads it at Commit
    push_staging: str = "memory"
    push_staging_warm: bool = True  # memory staging: reuse a mapped staging file (warm_staging)
    load_root: str | None = None  # LoadWeights only under this directory; None = disabled
    # 0 < temperature < this is refused: vLLM silently raises it to 0.01; logits / T overflow f32
    min_temperature: float = 0.01

    def __post_init__(self):
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("ServerConfig: tls_cert and tls_key must be given together")
        for k in ("push_idle_timeout_s", "push_max_s", "data_auth_timeout_s", "data_wait_s"):
            if not getattr(self, k) > 0:
                raise ValueError(f"ServerConfig.{k} must be > 0, got {getattr(self, k)!r}")
        if self.push_staging not in ("memory", "file"):
            raise ValueError(
                f"ServerConfig.push_staging must be 'memory' or 'file', got {self.push_staging!r}"
            )
        if self.data_max_pending < 1:
            raise ValueError(
                f"ServerConfig.data_max_pending must be >= 1, got {self.data_max_pending!r}"
            )
        if self.data_port is not None and self.tls_cert is not None:
            raise ValueError(
                "ServerConfig: the push data port (raw TCP, unencrypted) cannot be used with TLS; "
                "use it only on loopback / trusted networks without TLS, or leave data_port off"
            )
