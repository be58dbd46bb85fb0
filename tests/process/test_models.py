"""`localspec models`, `doctor` and `config`: the real pull code against a Hub cache laid out offline."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest
from support.commands import one_line_error, run_cli

from localspec.decoding.loader import RunConfig, load_models
from localspec.llama.model import amx_weights_disabled, gpu_offload_supported
from localspec.models.catalog import catalog

REPO = "test-org/tiny-GGUF"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def hub_cache(tmp_path: Path, gemma_path: Path) -> dict[str, str]:
    """A Hugging Face cache holding REPO with two GGUF files (Gemma 3 270M linked in, no copy), offline."""
    repo = tmp_path / "hub" / f"models--{REPO.replace('/', '--')}"
    sha = catalog()["gemma-3-270m"].sha256
    assert sha is not None
    (repo / "blobs").mkdir(parents=True)
    (repo / "blobs" / sha).symlink_to(gemma_path)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    snap = repo / "snapshots" / COMMIT
    snap.mkdir(parents=True)
    for name in ("tiny-Q4_K_M.gguf", "tiny-Q8_0.gguf"):
        (snap / name).symlink_to(f"../../blobs/{sha}")
    return {
        "HF_HUB_CACHE": str(tmp_path / "hub"),
        "HF_HUB_OFFLINE": "1",
        "LOCALSPEC_MODELS_DIR": str(tmp_path / "models"),
    }


def test_pull_list_use_verify_rm_offline(hub_cache: dict[str, str]) -> None:
    pulled = run_cli("models", "pull", REPO, env=hub_cache)  # no FILE: two files, Q4_K_M chosen
    assert pulled.returncode == 0, pulled.stderr
    assert pulled.stdout.strip().endswith("tiny-Q4_K_M.gguf") and "pulling tiny-Q4_K_M.gguf" in pulled.stderr

    listed = run_cli("models", "list", "--json", env=hub_cache)
    rows = {r["name"]: r for r in json.loads(listed.stdout)}
    assert rows["tiny-Q4_K_M"]["architecture"] == "gemma3" and rows["tiny-Q4_K_M"]["where"] == "hub"
    assert rows["tiny-Q4_K_M"]["quantization"] == "Q4_K_M" and rows["tiny-Q4_K_M"]["vocabulary"] == 262_144

    out = run_cli(
        "generate",
        "--json",
        "--raw",
        "-n",
        "3",
        "--temperature",
        "0",
        "--draft",
        "ngram",
        "--target",
        f"{REPO}:tiny-Q8_0.gguf",
        "Once upon a time",
        env=hub_cache,
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["target"].endswith("tiny-Q8_0.gguf")

    verified = run_cli("models", "verify", "tiny-Q4_K_M", env=hub_cache)
    assert verified.returncode == 0 and "tiny-Q4_K_M: ok" in verified.stdout, verified.stderr

    assert run_cli("models", "rm", "tiny-Q8_0", env=hub_cache).returncode == 0
    names = {r["name"] for r in json.loads(run_cli("models", "list", "--json", env=hub_cache).stdout)}
    assert "tiny-Q8_0" not in names and "tiny-Q4_K_M" in names  # the shared blob stays for the other file


def test_pull_errors_say_what_to_do(hub_cache: dict[str, str]) -> None:
    one_line_error(
        run_cli("models", "pull", REPO, "missing-Q2_K.gguf", env=hub_cache),
        "not in the Hugging Face cache",
        "HF_HUB_OFFLINE",
    )
    no_network = {**hub_cache, "HF_HUB_OFFLINE": "0", "HF_ENDPOINT": "http://127.0.0.1:9"}  # nothing listens
    one_line_error(
        run_cli("models", "pull", "other-org/absent-GGUF", "x.gguf", env=no_network),
        "cannot reach the Hugging Face Hub",
        "check the network",
    )


class _NoSuchRepo(BaseHTTPRequestHandler):
    def _answer(self) -> None:
        self.send_response(404)
        self.send_header("X-Error-Code", "RepoNotFound")
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_HEAD = _answer

    def log_message(self, *args) -> None:
        pass


def test_pull_missing_repo(hub_cache: dict[str, str]) -> None:
    server = HTTPServer(("127.0.0.1", 0), _NoSuchRepo)  # a Hub that knows no repository
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        env = {**hub_cache, "HF_HUB_OFFLINE": "0", "HF_ENDPOINT": f"http://127.0.0.1:{server.server_port}"}
        one_line_error(run_cli("models", "pull", "nobody/nothing-GGUF", env=env), "no such repository", "HF_TOKEN")
    finally:
        server.shutdown()


def test_check_pairs(target_path, draft_path, gemma_path) -> None:
    ok = run_cli("models", "check", "qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct")
    assert ok.returncode == 0 and ok.stdout.startswith("ok:"), ok.stderr
    one_line_error(
        run_cli("models", "check", str(target_path), str(gemma_path)), "first differing token is id 0", "'!'", "'<pad>'"
    )


def test_list_roles(target_path, draft_path, gemma_path, tmp_path: Path) -> None:
    listed = run_cli("models", "list", "--json", env={"HF_HUB_CACHE": str(tmp_path), "HF_HUB_OFFLINE": "1"})
    roles = {r["name"]: r["role"] for r in json.loads(listed.stdout)}
    assert roles["qwen2.5-coder-1.5b-instruct"] == "target" and roles["qwen2.5-coder-0.5b-instruct"] == "draft"
    assert roles["gemma-3-270m"].startswith("target (no draft here")


def test_offload_flags_reach_llama_cpp(draft_path: Path) -> None:
    t, d = load_models(
        RunConfig(
            target=str(draft_path), draft=str(draft_path), gpu_layers=3, draft_gpu_layers=2, flash_attn=True, ctx=256
        )
    )
    assert d is not None
    assert t.llm.model_params.n_gpu_layers == 3 and d.llm.model_params.n_gpu_layers == 2
    assert t.llm.context_params.flash_attn_type == 1  # LLAMA_FLASH_ATTN_TYPE_ENABLED
    default, _ = load_models(RunConfig(target=str(draft_path), no_draft=True, ctx=256))
    assert default.llm.model_params.n_gpu_layers == (999 if gpu_offload_supported() else 0)
    assert default.llm.context_params.flash_attn_type == 0
    # where the build uses AMX (a native crash on some CPUs), weights stay out of the extra buffer types
    assert default.llm.model_params.use_extra_bufts is not amx_weights_disabled()


def test_doctor_runs(target_path, draft_path) -> None:
    proc = run_cli("doctor", "--seconds", "0.5")
    assert proc.returncode == 0, proc.stderr
    assert "backends: CPU" in proc.stdout and "default pair qwen2.5-coder-1.5b-instruct" in proc.stdout
    assert "compatible" in proc.stdout and proc.stdout.count("speed ") >= 2


def test_config_precedence(tmp_path: Path, draft_path: Path, gemma_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text(f'target = "{gemma_path}"\ntemperature = 0.0\ntop_k = 7\n')
    base = {"LOCALSPEC_CONFIG": str(config), "LOCALSPEC_TARGET": ""}

    def record(*flags: str, **env: str) -> dict:
        proc = run_cli("generate", "--json", "--raw", "-n", "2", "--no-draft", *flags, "Hello", env={**base, **env})
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)

    from_file = record()
    assert from_file["target"] == str(gemma_path) and from_file["temperature"] == 0 and from_file["top_k"] == 7
    from_env = record(LOCALSPEC_TARGET=str(draft_path))
    assert from_env["target"] == str(draft_path) and from_env["top_k"] == 7
    from_flag = record("--target", str(gemma_path), "--top-k", "3", LOCALSPEC_TARGET=str(draft_path))
    assert from_flag["target"] == str(gemma_path) and from_flag["top_k"] == 3

    shown = run_cli("config", "show", env={**base, "LOCALSPEC_TARGET": str(draft_path)}).stdout
    lines = {line.split()[0]: line for line in shown.splitlines()[1:]}
    assert lines["target"].endswith("environment LOCALSPEC_TARGET") and lines["top_k"].endswith("config file")
    assert lines["top_p"].endswith("default")

    config.write_text("temperature = -1\n")
    one_line_error(run_cli("config", "show", env=base), str(config), "temperature")
    config.write_text("colour = 'blue'\n")
    one_line_error(run_cli("generate", "hi", env=base), "unknown setting(s) colour")
