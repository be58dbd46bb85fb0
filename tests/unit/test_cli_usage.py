"""The command line's usage errors, before any model loads: one line each."""

from __future__ import annotations

from pathlib import Path

from support.commands import one_line_error, run_cli


def test_a_bad_flag_value_is_a_usage_error_from_the_real_command() -> None:
    """Through main() in a subprocess (tests/unit/test_settings.py covers each flag in process)."""
    proc = run_cli("generate", "hello", "--temperature", "nan")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "--temperature" in proc.stderr


def test_missing_model_file(tmp_path: Path) -> None:
    """The missing target is named, whether or not the default draft is installed."""
    for models in (None, tmp_path):  # as installed in the checkout, and with no model installed at all
        env = {"LOCALSPEC_MODELS_DIR": str(models)} if models else None
        proc = run_cli("generate", "hello", "--target", "/nonexistent/model.gguf", env=env)
        assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0
        assert "/nonexistent/model.gguf" in proc.stderr and "0.5b" not in proc.stderr, proc.stderr


def test_a_bad_schema_or_grammar_is_one_line_before_any_model_loads(tmp_path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"type": "objectx"}')
    one_line_error(run_cli("generate", "--json-schema", str(bad), "hi"), "bad.json", "objectx")
    bad.write_text("{not json")
    one_line_error(run_cli("generate", "--json-schema", str(bad), "hi"), "not JSON")
    gbnf = tmp_path / "bad.gbnf"
    gbnf.write_text('root ::= "a" (\n')
    one_line_error(run_cli("generate", "--grammar", str(gbnf), "hi"), "bad.gbnf")
