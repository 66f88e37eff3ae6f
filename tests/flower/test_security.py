"""TLS certificates and SuperNode keys (fedfew.flower.security), through ``fedfew flower-certs``."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedfew.cli.main import main


# -- flower-certs ---------------------------------------------------------------------------------------
def test_flower_certs_writes_a_ca_a_server_certificate_and_node_keys(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("cryptography")
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    folder = tmp_path / "certs"
    assert main(["flower-certs", str(folder), "--host", "127.0.0.1", "--host", "link.example", "--nodes", "2"]) == 0
    assert "node-0" in capsys.readouterr().out
    ca = x509.load_pem_x509_certificate((folder / "ca.pem").read_bytes())
    cert = x509.load_pem_x509_certificate((folder / "server.pem").read_bytes())
    assert cert.issuer == ca.subject  # the server certificate is signed by the CA
    cert.verify_directly_issued_by(ca)
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "link.example" in names.get_values_for_type(x509.DNSName)
    assert [str(ip) for ip in names.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    for k in range(2):
        serialization.load_ssh_private_key((folder / f"node-{k}").read_bytes(), password=None)
        assert oct((folder / f"node-{k}").stat().st_mode)[-3:] == "600"
        assert (folder / f"node-{k}.pub").read_text().startswith("ecdsa-sha2-nistp384 ")
