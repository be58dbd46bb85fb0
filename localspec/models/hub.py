"""GGUF files from the Hugging Face Hub: pull into huggingface-hub's own cache, list, verify, remove.

Everything goes through huggingface-hub (its cache, its progress bars, HF_TOKEN, HF_HUB_OFFLINE,
HF_ENDPOINT), so a model pulled here is shared with every other tool that uses the Hub.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from localspec.errors import LocalspecError

_SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class CachedFile:
    """A GGUF file in the Hub cache."""

    repo: str
    file: str
    path: Path  # the snapshot path (a link to the blob)

    @property
    def ref(self) -> str:
        return f"{self.repo}:{self.file}"

    @property
    def sha256(self) -> str | None:
        """The Hub's sha256 of the file: the cache links a large (LFS) file to a blob named by its hash."""
        name = Path(os.readlink(self.path)).name if self.path.is_symlink() else ""
        return name if _SHA256.fullmatch(name) else None


def parse_ref(spec: str) -> tuple[str, str] | None:
    """'owner/repo:file.gguf' -> (repo, file); None when spec is not of that form."""
    repo, sep, file = spec.partition(":")
    if sep and file and re.fullmatch(r"[\w.-]+/[\w.-]+", repo):
        return repo, file
    return None


def _hub_error(e: Exception, repo: str, file: str | None) -> LocalspecError:
    """A one-line error that says what to do."""
    from huggingface_hub import constants
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
    )

    what = f"{repo}:{file}" if file else repo
    if isinstance(e, GatedRepoError):
        return LocalspecError(
            f"{repo} is gated: accept its terms on huggingface.co, then set HF_TOKEN to a token of that account"
        )
    if isinstance(e, RepositoryNotFoundError):
        return LocalspecError(f"{repo}: no such repository on the Hub (check the name; a private repo needs HF_TOKEN)")
    if isinstance(e, (LocalEntryNotFoundError, ConnectionError)):
        if constants.HF_HUB_OFFLINE:
            return LocalspecError(
                f"{what} is not in the Hugging Face cache ({constants.HF_HUB_CACHE}) and "
                f"HF_HUB_OFFLINE is set: unset it to download"
            )
        return LocalspecError(
            f"cannot reach the Hugging Face Hub ({constants.ENDPOINT}) and {what} is not "
            f"cached: check the network or proxy and retry"
        )
    if isinstance(e, EntryNotFoundError):
        return LocalspecError(f"{repo} has no file {file} (`localspec models pull {repo}` lists its GGUF files)")
    if isinstance(e, HfHubHTTPError):
        return LocalspecError(f"the Hugging Face Hub refused {what}: {str(e).splitlines()[0]}")
    return LocalspecError(f"cannot download {what}: {e}")


def cached_files() -> list[CachedFile]:
    """Every GGUF file in the Hub cache (none when there is no cache yet)."""
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    try:
        info = scan_cache_dir()
    except CacheNotFound:
        return []
    out = []
    for repo in info.repos:
        for rev in repo.revisions:
            for f in rev.files:
                if f.file_name.endswith(".gguf"):
                    out.append(CachedFile(repo.repo_id, str(f.file_path.relative_to(rev.snapshot_path)), f.file_path))
    return sorted(set(out), key=lambda c: c.ref)


def gguf_files(repo: str) -> list[str]:
    """The GGUF files of a Hub repository (from the cache when the Hub cannot be reached)."""
    from huggingface_hub import HfApi

    try:
        return sorted(f for f in HfApi().list_repo_files(repo) if f.endswith(".gguf"))
    except Exception as e:  # offline or unreachable: what the cache holds of that repo is still usable
        cached = sorted(c.file for c in cached_files() if c.repo == repo)
        if cached:
            return cached
        raise _hub_error(e, repo, None) from None


def choose(repo: str, files: list[str]) -> str:
    """The file to pull when none is named: the only one, else Q4_K_M (llama.cpp's usual default)."""
    if len(files) == 1:
        return files[0]
    q4 = [f for f in files if "q4_k_m" in f.lower()]
    if q4:
        return min(q4, key=len)
    if not files:
        raise LocalspecError(f"{repo} holds no GGUF files")
    raise LocalspecError(f"{repo} holds {len(files)} GGUF files and none is Q4_K_M; name one: " + ", ".join(files))


def pull(repo: str, file: str | None = None) -> Path:
    """Download (or find in the cache) repo's GGUF `file`, chosen by choose() when omitted. A Hub that refuses the
    connection is known at once (unreachable): the cache answers then, not after huggingface-hub's retries."""
    from huggingface_hub import constants

    if not constants.HF_HUB_OFFLINE and (why := unreachable()) is not None:
        cached = {c.file: c.path for c in cached_files() if c.repo == repo}
        name = file if file is not None or not cached else choose(repo, sorted(cached))
        if name in cached:
            return cached[name]
        raise _hub_error(ConnectionError(why), repo, file)
    if file is None:
        _quiet()
        files = gguf_files(repo)
        file = choose(repo, files)
        if len(files) > 1:
            import sys

            print(f"{repo} has {len(files)} GGUF files; pulling {file}", file=sys.stderr)
    return download(repo, file)


def _quiet() -> None:
    """huggingface-hub's retry warnings would bury the one-line error."""
    from huggingface_hub.utils import logging as hf_logging

    hf_logging.set_verbosity_error()


def unreachable(timeout: float = 5.0) -> str | None:
    """Why the Hub cannot be reached now, or None when it answers (any HTTP status is an answer). One quick try:
    huggingface-hub itself retries a refused connection for about 20 s before giving up."""
    import urllib.error
    import urllib.request

    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return "HF_HUB_OFFLINE is set"
    try:
        urllib.request.urlopen(urllib.request.Request(constants.ENDPOINT, method="HEAD"), timeout=timeout).close()
    except urllib.error.HTTPError:
        return None
    except (OSError, ValueError) as e:  # URLError, a timeout, a refused connection; a malformed HF_ENDPOINT
        reason = getattr(e, "reason", e)
        return f"cannot reach the Hugging Face Hub ({constants.ENDPOINT}: {reason})"
    return None


def pin(repo: str, file: str) -> tuple[int, str]:
    """(size, sha256) the Hub publishes for a large (LFS) file, read before anything of it is downloaded."""
    from huggingface_hub import HfApi

    _quiet()
    try:
        infos = HfApi().get_paths_info(repo, [file])
    except Exception as e:
        raise _hub_error(e, repo, file) from None
    info = next((i for i in infos if getattr(i, "path", None) == file), None)
    lfs = getattr(info, "lfs", None)
    if info is None or lfs is None or not _SHA256.fullmatch(str(lfs.sha256)):
        raise LocalspecError(f"{repo}:{file}: the Hub publishes no sha256 of it, so it cannot be installed verified")
    return int(lfs.size), str(lfs.sha256)


def download(repo: str, file: str, folder: Path | None = None) -> Path:
    """Download repo's `file` into the Hugging Face cache, or into `folder` (where the caller verifies it before it
    is used); an interrupted download resumes. One-line LocalspecError when the Hub cannot give it."""
    from huggingface_hub import hf_hub_download

    _quiet()
    try:
        return Path(hf_hub_download(repo, file, local_dir=folder))
    except Exception as e:
        raise _hub_error(e, repo, file) from None


def remove(cached: CachedFile) -> None:
    """Delete a pulled file: its snapshot link and, when no other snapshot uses it, its blob."""
    link = cached.path
    blob = (link.parent / os.readlink(link)) if link.is_symlink() else None
    link.unlink()
    if blob is not None:
        repo_dir = next(p for p in link.parents if p.name.startswith("models--"))
        others = [p for p in repo_dir.glob("snapshots/**/*") if p.is_symlink() and os.path.samefile(p, blob)]
        if not others:
            blob.unlink(missing_ok=True)
