"""Backends without TLS refuse TLS options with a ValueError that says so (issue 12): an
encrypted connection asked for must never be made in the clear, and "unknown option" would
read like a typo. (Redis and MySQL over TLS are tested in tests/test_redis_tls.py and
tests/test_mysql_tls.py.)

No server is needed: the options are refused when the client is made.
"""

from __future__ import annotations

from typing import Any

import pytest

import aiodlock

URLS = {"zookeeper": "zookeeper://127.0.0.1:2181/locks"}
REFUSED: list[tuple[str, dict[str, Any]]] = [
    ("?ssl=true", {}),
    ("?ssl_ca_certs=/etc/ssl/ca.pem", {}),
    ("?ssl_ca=/etc/ssl/ca.pem&ssl_cert=/c.pem&ssl_key=/k.pem", {}),
    ("", {"ssl_certfile": "/c.pem"}),
    ("", {"ssl_cert_reqs": "required"}),
    ("", {"tls": True}),
]


def _check(backend: str, query: str, options: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=rf"{backend}:// does not support TLS yet") as info:
        aiodlock.connect(URLS[backend] + query, **options)
    message = str(info.value)
    assert f"docs/{backend}.md" in message
    assert "hunter2" not in message
    aiodlock.connect(URLS[backend] + "?ssl=false")  # asks for nothing: fine


@pytest.mark.zookeeper
@pytest.mark.parametrize(("query", "options"), REFUSED)
def test_zookeeper_refuses_tls_options(query: str, options: dict[str, Any]) -> None:
    _check("zookeeper", query, options)
