"""`ferry users add/list/remove/rotate`: output, exit codes, and what lands on disk."""
from __future__ import annotations

import stat
import sys

import pytest

from app import cli
from app.paths import get_paths
from web.access.users import UserStore

pytestmark = pytest.mark.usefixtures("ferry_home")  # its own FERRY_HOME for every test


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def store() -> UserStore:
    return UserStore(get_paths().users_file)


def test_add_prints_token_once(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "users", "add", "ann", "--admin")
    assert code == 0
    token = out.strip()
    assert token.startswith("fy_") and "\n" not in token  # stdout is just the token
    assert "only this once" in err and "admin ann" in err
    assert store().verify(token) is not None and store().verify(token).is_admin  # type: ignore[union-attr]
    users_file = get_paths().users_file
    assert token not in users_file.read_text()
    if sys.platform != "win32":
        assert stat.S_IMODE(users_file.stat().st_mode) == 0o600
    # list never shows it again
    code, out, _ = run(capsys, "users", "list")
    assert code == 0 and token not in out


def test_list(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "users", "list")
    assert code == 0 and "No users yet" in out and "ferry users add" in out
    run(capsys, "users", "add", "ann", "--admin")
    run(capsys, "users", "add", "bob")
    code, out, _ = run(capsys, "users", "list")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ["NAME", "ADMIN", "CREATED", "ROTATED"]
    ann, bob = lines[1].split(), lines[2].split()
    assert ann[:2] == ["ann", "yes"] and bob[:2] == ["bob", "no"]
    assert ann[2].endswith("Z") and ann[3] == "-"


def test_rotate(capsys: pytest.CaptureFixture[str]) -> None:
    _, old, _ = run(capsys, "users", "add", "bob")
    code, new, err = run(capsys, "users", "rotate", "bob")
    assert code == 0 and new.strip().startswith("fy_") and new != old
    assert "no longer work" in err
    assert store().verify(old.strip()) is None
    assert store().verify(new.strip()) is not None
    _, out, _ = run(capsys, "users", "list")
    assert out.splitlines()[1].split()[3] != "-"


def test_remove(capsys: pytest.CaptureFixture[str]) -> None:
    _, token, _ = run(capsys, "users", "add", "bob")
    code, out, _ = run(capsys, "users", "remove", "bob")
    assert code == 0 and "Removed bob" in out
    assert store().verify(token.strip()) is None and not store().has_users()


@pytest.mark.parametrize("action", ["remove", "rotate"])
def test_missing_user_exits_1(capsys: pytest.CaptureFixture[str], action: str) -> None:
    code, out, err = run(capsys, "users", action, "ghost")
    assert code == 1 and out == ""
    assert f"ferry users {action}: error: no user named 'ghost'" in err


def test_add_errors_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    run(capsys, "users", "add", "ann")
    code, out, err = run(capsys, "users", "add", "ann")
    assert code == 1 and out == "" and "already exists" in err
    code, out, err = run(capsys, "users", "add", "bad name")
    assert code == 1 and out == "" and "invalid user name" in err


def test_damaged_file_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    users_file = get_paths().users_file
    users_file.parent.mkdir(parents=True)
    users_file.write_text("{oops")
    code, _, err = run(capsys, "users", "list")
    assert code == 1 and "not valid JSON" in err


def test_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(capsys, "users")[0] == 2
    assert run(capsys, "users", "add")[0] == 2


def test_shared_serve_accepts_added_user(capsys: pytest.CaptureFixture[str]) -> None:
    from app.preflight import PreflightError, check_serve
    from app.settings import Settings

    settings = Settings(host="0.0.0.0", port=1)
    with pytest.raises(PreflightError, match="ferry users add"):
        check_serve(settings, get_paths())
    run(capsys, "users", "add", "ann", "--admin")
    try:
        check_serve(settings, get_paths())
    except PreflightError as exc:  # port 1 may be refused; the users check passed
        assert "users" not in str(exc)
