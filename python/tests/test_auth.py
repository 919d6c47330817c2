"""The cluster secret from Python, once per native transport (tcp and shm):
a server started with `--auth-token-file` lets in a Python client only
when it holds the same secret (from FABRICKV_AUTH_TOKEN, the file
FABRICKV_AUTH_TOKEN_FILE names, or `fabrickv.set_auth_token_file`), and
refuses it otherwise with a stable code that says what is missing.

Needs `make python` (the module in .venv) and `make build` (the server)."""

from pathlib import Path
from typing import Iterator

import pytest

from conftest import TRANSPORTS, Server, listen_addr

try:
    import fabrickv
except ImportError as e:  # a missing build fails the run, never skips it
    pytest.fail(f"the fabrickv module is not installed ({e}): run `make python`",
                pytrace=False)

SECRET = "the cluster secret of the python tests"


class SecretServer(Server):
    """A server started with `--auth-token-file`: `token` holds its secret,
    `wrong` another."""

    token: Path
    wrong: Path


def write_token(path: Path, text: str) -> Path:
    path.write_text(text + "\n")
    path.chmod(0o600)
    return path


@pytest.fixture(scope="module", params=TRANSPORTS)
def secret_server(request: pytest.FixtureRequest,
                  tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecretServer]:
    d = tmp_path_factory.mktemp("auth")
    s = SecretServer("--auth-token-file", str(write_token(d / "token", SECRET)),
                     listen=listen_addr(request.param))
    s.token = d / "token"
    s.wrong = write_token(d / "wrong", "a secret that is not the server's")
    yield s
    assert s.stop() == 0, "the server exits cleanly on SIGTERM"


@pytest.fixture(autouse=True)
def no_secret(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test starts with no secret in the environment or the module."""
    monkeypatch.delenv("FABRICKV_AUTH_TOKEN", raising=False)
    monkeypatch.delenv("FABRICKV_AUTH_TOKEN_FILE", raising=False)
    fabrickv.set_auth_token_file(None)
    yield
    fabrickv.set_auth_token_file(None)


def refused(addr: str) -> fabrickv.Error:
    with pytest.raises(fabrickv.Error) as e:
        fabrickv.Client(addr, timeout=5.0)
    return e.value


def round_trip(addr: str, key: bytes) -> None:
    with fabrickv.Client(addr, timeout=5.0) as c:
        c.put(key, b"value")
        assert c.get(key) == b"value"


def test_a_client_without_the_secret_is_told_how_to_give_one(
        secret_server: SecretServer) -> None:
    e = refused(secret_server.native)
    assert e.code == "AUTH_REQUIRED"
    assert "FABRICKV_AUTH_TOKEN" in str(e) and "--auth-token-file" in str(e)


def test_the_secret_from_the_environment_lets_a_client_in(
        secret_server: SecretServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FABRICKV_AUTH_TOKEN", SECRET)
    round_trip(secret_server.native, b"from-env")
    monkeypatch.delenv("FABRICKV_AUTH_TOKEN")
    monkeypatch.setenv("FABRICKV_AUTH_TOKEN_FILE", str(secret_server.token))
    round_trip(secret_server.native, b"from-env-file")


def test_set_auth_token_file_and_a_wrong_secret(secret_server: SecretServer) -> None:
    fabrickv.set_auth_token_file(str(secret_server.wrong))
    e = refused(secret_server.native)
    assert e.code == "AUTH_FAILED", str(e)
    assert SECRET not in str(e) and "not the server's" not in str(e), "a secret leaked"
    fabrickv.set_auth_token_file(str(secret_server.token))
    round_trip(secret_server.native, b"from-file")
    with pytest.raises(fabrickv.Error) as missing:
        fabrickv.set_auth_token_file(str(secret_server.token) + ".missing")
    assert ".missing" in str(missing.value)
