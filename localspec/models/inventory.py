"""The GGUF models on this machine (models/ and the Hub cache): what each is, which role it can play."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from localspec.errors import LocalspecError
from localspec.models.catalog import CatalogModel, catalog, models_dir
from localspec.models.gguf import BadModelFile, GGUFInfo, read_gguf
from localspec.models.hub import CachedFile, cached_files, remove
from localspec.models.verify import stamp_path


@dataclass
class Entry:
    """One model file found here."""

    name: str
    path: Path
    where: str  # "models/" or "hub"
    info: GGUFInfo | None  # None when the header is bad
    problem: str = ""
    catalog: CatalogModel | None = None
    hub: CachedFile | None = None
    role: str = ""

    @property
    def size(self) -> int:
        return self.path.stat().st_size

    @property
    def expected_sha256(self) -> str | None:
        if self.catalog and self.catalog.sha256:
            return self.catalog.sha256
        return self.hub.sha256 if self.hub else None


def _entry(name: str, path: Path, where: str, **kw) -> Entry:
    try:
        info, problem = read_gguf(path, tokens=True), ""
    except BadModelFile as e:
        info, problem = None, str(e).removeprefix(f"{path}: ")
    return Entry(name, path, where, info, problem, **kw)


def _vocab_key(info: GGUFInfo) -> int:
    return hash(info.tokens_raw or b"")


def _assign_roles(entries: list[Entry]) -> None:
    """A model can draft for a bigger one with its vocabulary, and be the target of a smaller one."""
    ok = [(e, e.info) for e in entries if e.info]
    keys = {id(e): _vocab_key(info) for e, info in ok}
    for e, info in ok:
        same = [o for o, _ in ok if o is not e and keys[id(o)] == keys[id(e)]]
        roles = []
        if any(o.info and o.info.n_params < info.n_params for o in same):
            roles.append("target")
        if any(o.info and o.info.n_params > info.n_params for o in same):
            roles.append("draft")
        e.role = " / ".join(roles) or "target (no draft here shares its vocabulary; --draft copier)"
    for _, info in ok:
        info.tokens_raw = None  # done with them: keep the listing light
    for e in entries:
        e.role = e.role or "unusable"


def find_models() -> list[Entry]:
    """Every GGUF file in models/ and in the Hugging Face cache, with its header and role."""
    by_file = {m.file: m for m in catalog().values()}
    names = {m.file: n for n, m in catalog().items()}
    entries = [
        _entry(names.get(p.name, p.stem), p, "models/", catalog=by_file.get(p.name))
        for p in sorted(models_dir().glob("*.gguf"))
    ]
    for c in cached_files():
        entries.append(_entry(names.get(c.file, Path(c.file).stem), c.path, "hub", catalog=by_file.get(c.file), hub=c))
    _assign_roles(entries)
    return entries


def find(name: str) -> Entry:
    """The model called `name` (its name, file name or REPO:FILE)."""
    entries = find_models()
    for e in entries:
        if name in (e.name, e.path.name, str(e.path)) or (e.hub and name == e.hub.ref):
            return e
    raise LocalspecError(
        f"no model '{name}' here (`localspec models list` shows: {', '.join(e.name for e in entries) or 'none'})"
    )


def delete(entry: Entry) -> None:
    """Remove a model file (and its install stamp, or its Hub cache blob)."""
    if entry.hub:
        remove(entry.hub)
        return
    entry.path.unlink()
    stamp_path(entry.path).unlink(missing_ok=True)
