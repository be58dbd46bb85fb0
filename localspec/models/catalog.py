"""Where models live, what models/catalog.json knows about them, and turning a model argument into a file.

A model argument is a path, a file name in models/, a catalog name, a pulled file's name, or
REPO:FILE on the Hugging Face Hub (pulled into the Hub cache on first use).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from localspec.errors import LocalspecError
from localspec.models.verify import check_installed
from localspec.paths import data_dir

_CATALOG = Path(__file__).with_name("catalog.json")
_CHECKOUT_MODELS = Path(__file__).resolve().parents[2] / "models"  # meaningful only in a source checkout


@dataclass(frozen=True)
class CatalogModel:
    """One known-good GGUF file and where to get it (the Hub; some also from the package registry)."""

    name: str
    file: str  # its name in models/ and in the Hub repository
    hf: str  # Hub repository
    size: int | None = None
    sha256: str | None = None
    registry_prefix: str | None = None  # chunk packages <prefix>1 … <prefix>N on the package registry
    registry_parts: int = 0
    registry_version: str = ""

    @property
    def packages(self) -> list[str]:
        """The registry chunk packages, in concatenation order, pinned."""
        return [f"{self.registry_prefix}{i}=={self.registry_version}" for i in range(1, self.registry_parts + 1)]


def models_dir() -> Path:
    """The folder holding GGUF files.

    $LOCALSPEC_MODELS_DIR, else the checkout's models/ when localspec runs from a source checkout
    (an editable install), else models/ in the user's data directory.
    """
    if env := os.environ.get("LOCALSPEC_MODELS_DIR"):
        return Path(env).expanduser()
    if (_CHECKOUT_MODELS / "README.md").is_file() and (_CHECKOUT_MODELS.parent / "pyproject.toml").is_file():
        return _CHECKOUT_MODELS
    return data_dir() / "models"


@lru_cache(maxsize=1)
def _raw() -> dict:
    return json.loads(_CATALOG.read_text())


def catalog() -> dict[str, CatalogModel]:
    """All catalog models by name."""
    out = {}
    for name, m in _raw()["models"].items():
        reg = m.get("registry") or {}
        out[name] = CatalogModel(
            name,
            m["file"],
            m["hf"],
            m.get("size"),
            m.get("sha256"),
            reg.get("prefix"),
            reg.get("parts", 0),
            reg.get("version", ""),
        )
    return out


def pairs() -> dict[str, tuple[CatalogModel, CatalogModel]]:
    """Named (target, draft) pairs of the catalog."""
    models = catalog()
    return {name: (models[p["target"]], models[p["draft"]]) for name, p in _raw()["pairs"].items()}


def default_pair() -> tuple[CatalogModel, CatalogModel]:
    """(target, draft) of the default pair."""
    return pairs()["default"]


def _catalog_path(model: CatalogModel) -> Path:
    """Where a catalog model is: installed, or in the Hugging Face cache (either checked against the catalog's
    size and hash before it is loaded), else pulled from the Hub where it has no registry packages."""
    local = models_dir() / model.file
    if local.exists():
        check_installed(model, local)
        return local
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(model.hf, model.file)
    if isinstance(cached, str):
        if model.size is not None and model.sha256 is not None:
            check_installed(model, Path(cached))
        return Path(cached)
    if model.registry_prefix:
        raise LocalspecError(f"{model.name} is not installed: run `localspec models install {model.name}`")
    from localspec.models.hub import pull

    return pull(model.hf, model.file)


def resolve(spec: str) -> Path:
    """A model argument as the path of a GGUF file (pulling REPO:FILE or a Hub-only catalog model)."""
    from localspec.models.hub import cached_files, parse_ref, pull

    models = catalog()
    if spec in models:
        return _catalog_path(models[spec])
    path = Path(spec).expanduser()
    if path.exists():
        return path
    if not path.is_absolute() and (models_dir() / spec).exists():
        return models_dir() / spec
    if ref := parse_ref(spec):
        return pull(*ref)
    pulled = [c.path for c in cached_files() if spec in (c.file, Path(c.file).stem, c.ref)]
    if pulled:
        return pulled[0]
    if os.sep in spec or spec.endswith(".gguf"):
        return path  # a path: the GGUF check names it as missing
    raise LocalspecError(
        f"unknown model '{spec}': not a file, a catalog name ({', '.join(models)}), a pulled "
        f"model or REPO:FILE (`localspec models list` shows what is here)"
    )
