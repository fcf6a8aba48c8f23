"""`dlc-jax sampler serve` as a real subprocess: shared-token auth, TLS, the info CLI, SIGKILL."""

from __future__ import annotations

import datetime
import json
import subprocess
import sys

import grpc
import numpy as np
import pytest
from test_sampler_service import BACKENDS, tiny_dir  # noqa: F401  (session fixture)

from dlc_jax.sampler.client.client import SamplerClient
from dlc_jax.sampler.service.process import SamplerProcess
from dlc_jax.sampler.wire.types import SamplingParams


def _self_signed(tmp_path):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
        .sign(key, hashes.SHA256())
    )
    cert_p, key_p = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_p.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_p.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return str(cert_p), str(key_p)


@pytest.mark.parametrize("backend", BACKENDS)
def test_subprocess_auth_tls_info_and_kill(backend, tiny_dir, tmp_path):  # noqa: F811
    cert, key = _self_signed(tmp_path)
    proc = SamplerProcess(
        backend,
        tiny_dir,
        token="s3cret",
        tls_root_cert=cert,
        tls_server_name="localhost",
        extra_args=["--max-model-len", "128", "--tls-cert", cert, "--tls-key", key],
    )
    proc.start()
    try:
        good = proc.client(max_retries=0)
        info = good.info()
        assert info["backend"] == backend and info["version"] == 0 and info["max_model_len"] == 128
        (r,) = list(good.generate([[1, 2, 3]], SamplingParams(max_tokens=4, seed=3)))
        assert len(r.response_ids) == 4

        for token in (None, "wrong"):
            bad = proc.client(token=token, max_retries=0)
            calls = (
                bad.info,
                lambda c=bad: list(c.generate([[1, 2]], SamplingParams(max_tokens=2))),
                lambda c=bad: c.push_weights({"lm_head.weight": np.zeros((2, 2), np.float32)}, 5),
            )
            for call in calls:
                with pytest.raises(grpc.RpcError) as ei:
                    call()
                assert ei.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.RpcError):  # plaintext to the TLS port fails
            SamplerClient(proc.address, token="s3cret", max_retries=0, timeout=5).info()
        assert good.info()["pushes"] == 0  # the unauthenticated push did nothing

        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "dlc_jax.cli",
                "sampler",
                "info",
                "--address",
                proc.address,
                "--token",
                "s3cret",
                "--tls-root-cert",
                cert,
                "--tls-server-name",
                "localhost",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 0, out.stderr[-2000:]
        assert json.loads(out.stdout)["backend"] == backend

        proc.kill()  # crash: clients get UNAVAILABLE (after retries), not a hang
        with pytest.raises(grpc.RpcError) as ei:
            proc.client(max_retries=1, backoff=0.05, timeout=10).info()
        assert ei.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        proc.kill()
