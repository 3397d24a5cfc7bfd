"""Certificates for TLS tests, made per test run with ``trustme`` (a throwaway CA).

    pki = Pki(tmp_path)          # CA, a server cert for localhost/127.0.0.1, a client cert
    pki.ca, pki.server_cert, pki.server_key, pki.client_cert, pki.client_key   # PEM paths
    pki.other_client_cert        # a client cert from another CA (not trusted by the server)
"""

from __future__ import annotations

from pathlib import Path

import trustme


class Pki:
    def __init__(self, directory: Path) -> None:
        self.dir = Path(directory)
        self.authority = trustme.CA()
        server = self.authority.issue_cert("localhost", "127.0.0.1")
        client = self.authority.issue_cert("client.tailgate.test")
        stranger = trustme.CA().issue_cert("stranger.tailgate.test")
        self.ca = self._write("ca.pem", self.authority.cert_pem.bytes())
        self.server_cert = self._write("server.pem", b"".join(
            p.bytes() for p in server.cert_chain_pems))
        self.server_key = self._write("server.key", server.private_key_pem.bytes())
        self.client_cert = self._write("client.pem", b"".join(
            p.bytes() for p in client.cert_chain_pems))
        self.client_key = self._write("client.key", client.private_key_pem.bytes())
        # certificate and key in one file (what --cert alone accepts)
        self.client_combined = self._write("client-combined.pem",
                                           client.private_key_and_cert_chain_pem.bytes())
        self.other_client_cert = self._write("stranger.pem", b"".join(
            p.bytes() for p in stranger.cert_chain_pems))
        self.other_client_key = self._write("stranger.key", stranger.private_key_pem.bytes())

    def _write(self, name: str, data: bytes) -> str:
        path = self.dir / name
        path.write_bytes(data)
        return str(path)
