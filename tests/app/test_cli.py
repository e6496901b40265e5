"""The `ferry` command: help texts, serve validation and exit codes, models, doctor, dispatch."""
from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import app.serve
from app import cli
from app.paths import get_paths
from app.settings import engine_config
from web.access.users import UserStore

REPO = Path(__file__).resolve().parents[2]
SCENARIOS = REPO / "tests" / "data" / "scenarios"
FERRY = Path(sys.executable).parent / "ferry"


pytestmark = pytest.mark.usefixtures("ferry_home")  # its own FERRY_HOME for every test


@pytest.fixture(autouse=True)
def progress_bars_restored(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """`ferry serve` under pytest (not a terminal) turns progress bars off process-wide."""
    for name in ("TQDM_DISABLE", "HF_HUB_DISABLE_PROGRESS_BARS"):
        monkeypatch.delenv(name, raising=False)
    yield
    if "huggingface_hub" in sys.modules:
        from huggingface_hub.utils import enable_progress_bars
        enable_progress_bars()


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_top_level_help_lists_commands(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--help")
    assert code == 0
    for command in ("serve", "simulate", "bench", "users", "models", "doctor"):
        assert command in out


@pytest.mark.parametrize(("argv", "words"), [
    (["serve"], ["--host", "--port", "--model", "--dtype", "--policy", "--open",
                 "--print-config", "prefill-first|interleave|mixed", "auto|bfloat16|float32"]),
    (["users"], ["add", "list", "remove", "rotate", "access token"]),
    (["users", "add"], ["NAME", "--admin"]),
    (["models"], ["default model", "model_folders"]),
    (["doctor"], ["torch", "port", "Exits 1"]),
])
def test_subcommand_help(capsys: pytest.CaptureFixture[str], argv: list[str],
                         words: list[str]) -> None:
    code, out, _ = run(capsys, *argv, "--help")
    assert code == 0
    for word in words:
        assert word in out


def test_print_config_shows_sources(capsys: pytest.CaptureFixture[str], ferry_home: Path,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    config = get_paths().config_file
    config.parent.mkdir(parents=True)
    config.write_text("max_running = 3\n")
    monkeypatch.setenv("FERRY_DTYPE", "float32")
    code, out, _ = run(capsys, "serve", "--port", "9123", "--print-config")
    assert code == 0
    assert "port = 9123" in out and "# flag --port" in out
    assert "# env FERRY_DTYPE" in out
    assert f"# file {config}" in out
    assert f"config file: {config} (found)" in out


def test_missing_model_folder(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    missing = tmp_path / "no-such-model"
    code, _, err = run(capsys, "serve", "--model", str(missing), "--port", str(free_port()))
    assert code == 2
    assert "not found" in err and str(missing) in err


def test_a_file_ferry_cannot_run_is_one_line(capsys: pytest.CaptureFixture[str],
                                             tmp_path: Path) -> None:
    """Not a traceback: what is wrong with the file, and exit status 2."""
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"GGUF" + bytes(60))
    code, _, err = run(capsys, "serve", "--model", str(junk), "--port", str(free_port()),
                       "--no-open", "--no-discover")
    assert code == 2
    assert f"ferry serve: error: {junk}: its tokenizer could not be read" in err
    assert "Traceback" not in err


def test_port_in_use(capsys: pytest.CaptureFixture[str], busy_port: int) -> None:
    code, _, err = run(capsys, "serve", "--port", str(busy_port))
    assert code == 2
    assert "already in use" in err and str(busy_port) in err


def test_unreadable_config(capsys: pytest.CaptureFixture[str]) -> None:
    get_paths().config_file.mkdir(parents=True)  # root ignores chmod 000; a folder can't be read
    code, _, err = run(capsys, "serve")
    assert code == 2
    assert "cannot read config file" in err


def test_invalid_config(capsys: pytest.CaptureFixture[str]) -> None:
    config = get_paths().config_file
    config.parent.mkdir(parents=True)
    config.write_text("policy = mixed\n")  # unquoted string: not TOML
    code, _, err = run(capsys, "serve")
    assert code == 2
    assert "not valid TOML" in err and str(config) in err


def test_unknown_policy(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "serve", "--policy", "lifo")
    assert code == 2
    assert "policy" in err and "prefill-first, interleave, mixed" in err


def test_bad_port_flag_is_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "serve", "--port", "eighty")
    assert code == 2 and "--port" in err


def test_shared_host_requires_users(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "serve", "--host", "0.0.0.0", "--port", str(free_port()))
    assert code == 2
    assert "ferry users add" in err


def test_shared_host_with_damaged_users_file(capsys: pytest.CaptureFixture[str]) -> None:
    users = get_paths().users_file
    users.parent.mkdir(parents=True)
    users.write_text("{oops")
    code, _, err = run(capsys, "serve", "--host", "0.0.0.0", "--port", str(free_port()))
    assert code == 2
    assert "users.json is not valid JSON" in err


def test_serve_hands_valid_settings_to_run(capsys: pytest.CaptureFixture[str],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    seen = {}

    def fake_run(settings, paths, model):  # type: ignore[no-untyped-def]
        seen.update(settings=settings, paths=paths, model=model)
        return 0

    monkeypatch.setattr(app.serve, "run", fake_run)
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", list(root.handlers))  # serve adds handlers: undo them
    monkeypatch.setattr(root, "level", root.level)
    UserStore(get_paths().users_file, scrypt_n=2 ** 10).add("admin", admin=True)
    port = free_port()
    code, _, _ = run(capsys, "serve", "--host", "0.0.0.0", "--port", str(port))
    assert code == 0
    assert seen["settings"].port == port and seen["settings"].policy == "interleave"
    assert seen["model"].kind == "default"
    assert get_paths().log_file.parent.is_dir()


def test_models_lists_default_and_folders(capsys: pytest.CaptureFixture[str],
                                          tmp_path: Path) -> None:
    folder = tmp_path / "models"
    (folder / "tiny-llama").mkdir(parents=True)
    (folder / "tiny-llama" / "config.json").write_text("{}")
    (folder / "other.gguf").write_bytes(b"GGUF" + bytes(2044))
    from engine.execution.loading.loader import default_gguf_path

    (folder / "smol.gguf").symlink_to(default_gguf_path())
    config = get_paths().config_file
    config.parent.mkdir(parents=True)
    config.write_text(f"model_folders = [{json.dumps(str(folder))}, \"/nowhere\"]\n")
    code, out, _ = run(capsys, "models")
    assert code == 0
    assert "SmolLM2-135M-Instruct" in out and "SmolLM2-135M-Instruct.Q4_1.gguf" in out
    assert "converted copy: none yet" in out
    assert "tiny-llama" in out and "other" in out and "2.0 KiB" in out
    assert "/nowhere: missing" in out
    # which it runs (the architecture) and why not
    assert "runs: llama" in out
    assert "cannot run: model_type None is not supported (supported: llama, mistral" in out
    assert "cannot run: " in out.split("other.gguf")[1].splitlines()[1]


def test_models_shows_converted_copy(capsys: pytest.CaptureFixture[str]) -> None:
    copy = get_paths().models_cache / "SmolLM2-135M-Instruct.Q4_1"  # the converter's name
    copy.mkdir(parents=True)
    (copy / "model.safetensors").write_bytes(bytes(1024))
    code, out, _ = run(capsys, "models")
    assert code == 0 and f"converted copy: {copy} (1.0 KiB)" in out


def test_doctor_all_green(capsys: pytest.CaptureFixture[str],
                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FERRY_PORT", str(free_port()))
    code, out, _ = run(capsys, "doctor")
    assert code == 0, out
    for label in ("torch", "device", "bfloat16", "cpu kernels", "flashinfer", "model", "data dir",
                  "config dir", "cache dir", "log dir", "port", "lock", "transformers"):
        assert label in out
    assert "\u2717" not in out
    port = os.environ["FERRY_PORT"]
    assert f"answers Host 127.0.0.1:{port}, localhost:{port}, [::1]:{port}; others" in out


def test_doctor_red_on_busy_port_and_bad_config(capsys: pytest.CaptureFixture[str],
                                                busy_port: int) -> None:
    config = get_paths().config_file
    config.parent.mkdir(parents=True)
    config.write_text(f"port = {busy_port}\n")
    code, out, _ = run(capsys, "doctor")
    assert code == 1 and "already in use" in out
    config.write_text("port = 'x'\n")
    code, out, _ = run(capsys, "doctor")
    assert code == 1 and "port must be an integer" in out


def test_passthrough_missing_module(capsys: pytest.CaptureFixture[str],
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(cli.PASSTHROUGH, "bench", ("app.no_such_bench", "main"))
    code, _, err = run(capsys, "bench", "--baseline", "hf")
    assert code == 1 and "not available" in err


def test_passthrough_hands_over_argv(capsys: pytest.CaptureFixture[str],
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    import types
    fake = types.ModuleType("fake_bench")
    fake.main = lambda argv: print("got", argv) or 3  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "fake_bench", fake)
    monkeypatch.setitem(cli.PASSTHROUGH, "bench", ("fake_bench", "main"))
    code, out, _ = run(capsys, "bench", "--help", "--baseline", "hf")
    assert code == 3 and "got ['--help', '--baseline', 'hf']" in out


def test_entry_point_simulate_json() -> None:
    """The installed console script runs, and `simulate` reaches the engine's simulator."""
    scenario = SCENARIOS / "fig3-abc.json"
    assert scenario.is_file(), f"{scenario} is missing"
    done = subprocess.run([str(FERRY), "simulate", str(scenario), "--json"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["rounds"] and set(result["requests"]) == {"A", "B", "C"}


def test_serve_engine_flags(capsys: pytest.CaptureFixture[str],
                            monkeypatch: pytest.MonkeyPatch) -> None:
    flags = ("--max-running", "3", "--kv-tokens", "2048", "--max-prefill-tokens", "64",
             "--admission", "fair")
    code, out, _ = run(capsys, "serve", *flags, "--print-config")
    assert code == 0
    for line in ("max_running = 3", "kv_tokens = 2048", "max_prefill_tokens = 64",
                 'admission = "fair"'):
        assert line in out, out
    for flag in ("--max-running", "--kv-tokens", "--max-prefill-tokens", "--admission"):
        assert f"# flag {flag}" in out
    seen = {}

    def fake_run(settings, paths, model):  # type: ignore[no-untyped-def]
        seen.update(settings=settings)
        return 0

    monkeypatch.setattr(app.serve, "run", fake_run)
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", list(root.handlers))
    monkeypatch.setattr(root, "level", root.level)
    assert run(capsys, "serve", *flags, "--port", str(free_port()))[0] == 0
    engine = engine_config(seen["settings"])
    assert (engine.max_running, engine.kv_tokens, engine.max_prefill_tokens,
            engine.admission) == (3, 2048, 64, "fair")


@pytest.mark.parametrize("argv, words", [
    (["--max-running", "0"], "max_running"),
    (["--kv-tokens", "lots"], "invalid int"),
    (["--admission", "lifo"], "admission"),
])
def test_bad_engine_flags_are_usage_errors(capsys: pytest.CaptureFixture[str], argv: list[str],
                                           words: str) -> None:
    code, _, err = run(capsys, "serve", *argv, "--print-config")
    assert code == 2 and words in err, err


def test_doctor_port_flag(capsys: pytest.CaptureFixture[str], busy_port: int) -> None:
    code, out, _ = run(capsys, "doctor", "--port", str(busy_port))
    assert code == 1 and f"port {busy_port}" in out and "already in use" in out
    port = free_port()
    code, out, _ = run(capsys, "doctor", "--port", str(port))
    assert code == 0 and str(port) in out, out
    assert run(capsys, "doctor", "--port", "0")[0] == 1  # out of range: the config check fails


def test_progress_bars_are_plain_when_output_is_not_a_terminal(tmp_path: Path) -> None:
    """A log file (stderr redirected) gets no carriage returns or escape codes from tqdm or
    the Hugging Face hub; a terminal keeps its bars."""
    code = ("import sys; from app.logs import quiet_progress_bars; "
            "print(quiet_progress_bars(sys.stderr), file=sys.stdout); "
            "from tqdm import tqdm; [None for _ in tqdm(range(50), desc='loading')]; "
            "from huggingface_hub.utils import are_progress_bars_disabled; "
            "print(are_progress_bars_disabled())")
    log = tmp_path / "ferry.log"
    with log.open("w") as err:
        done = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=err,
                              text=True, cwd=REPO, check=True)
    assert done.stdout.split() == ["True", "True"]
    text = log.read_text()
    assert "\r" not in text and "\x1b" not in text and "loading" not in text

    import fcntl
    import pty
    import struct
    import termios
    parent, child = pty.openpty()
    fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # 0 wide: no bar
    try:
        done = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE,
                              stderr=child, text=True, cwd=REPO, check=True)
        shown = os.read(parent, 65536).decode(errors="replace")
    finally:
        os.close(child)
        os.close(parent)
    assert done.stdout.split()[0] == "False" and "loading" in shown and "\r" in shown


def test_serve_deterministic_flag(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "serve", "--deterministic", "--print-config")
    assert code == 0 and "deterministic = true" in out and "# flag --deterministic" in out
    code, out, _ = run(capsys, "serve", "--print-config")
    assert code == 0 and "deterministic = false" in out


def test_deterministic_is_refused_off_the_cpu() -> None:
    from app.serve import turn_deterministic_on

    error = turn_deterministic_on("cuda")
    assert error is not None and "CPU only" in error and "cuda" in error
