"""Model files from the Hugging Face hub, through ``huggingface_hub`` (the optional extra ``hub``):
what ``Model.from_pretrained`` and the command line's ``-hf REPO[:QUANT]`` / ``--hf-file FILE`` use.

One job: name a GGUF in a hub repository and get a local path to it (downloaded once into
huggingface_hub's cache, ``HF_HOME``; ``HF_ENDPOINT``, ``HF_TOKEN`` and ``HF_HUB_OFFLINE`` are
huggingface_hub's own). The file is chosen as llama.cpp chooses it: ``--hf-file`` (or
``from_pretrained``'s ``filename``, which may be a glob as in llama-cpp-python) when given, else the
GGUF whose name carries ``QUANT`` (case-insensitive; default :data:`DEFAULT_QUANT`, else the first
GGUF); ``mmproj`` files are never the model. The MTP assistant is the repository's file named like the
target by :func:`mtp_bindings.models.assistant_candidates` (``X-Q4_K_M.gguf`` ->
``X-assistant-Q4_K_M.gguf``), when there is one. No native code: importable without the extension.
"""

from __future__ import annotations

import fnmatch
import os
from pathlib import Path
from types import ModuleType
from typing import Any

from .exceptions import HubError, HubFileNotFoundError, HubNotInstalledError, InvalidParameterError
from .models import assistant_candidates

DEFAULT_QUANT = "Q4_K_M"  # llama.cpp's -hf default quant
INSTALL_HINT = "pip install 'mtp-bindings[hub]'"
# huggingface_hub's "not there" errors (looked up by name: their module moved between versions)
_NOT_FOUND = ("RepositoryNotFoundError", "RevisionNotFoundError", "EntryNotFoundError", "RemoteEntryNotFoundError",
              "LocalEntryNotFoundError")


def huggingface_hub() -> ModuleType:
    """The ``huggingface_hub`` module, or :class:`HubNotInstalledError` saying how to get it."""
    try:
        import huggingface_hub as hub
    except ImportError as e:
        raise HubNotInstalledError(f"downloading from the Hugging Face hub needs huggingface_hub: {INSTALL_HINT} "
                                   f"({e})") from None
    return hub


def parse_repo(spec: str) -> tuple[str, str | None]:
    """``"user/model[:quant]"`` -> ``("user/model", quant or None)`` (llama.cpp's ``-hf`` form)."""
    if not isinstance(spec, str) or not spec.strip():
        raise InvalidParameterError(f"a hub repository must be a non-empty string 'user/model[:quant]', got {spec!r}")
    repo, _, quant = spec.strip().partition(":")
    if repo.count("/") != 1 or not all(repo.split("/")):
        raise InvalidParameterError(f"a hub repository is 'user/model[:quant]', got {spec!r}")
    return repo, quant or None


def _is_model_gguf(name: str) -> bool:
    base = name.rsplit("/", 1)[-1].lower()
    return base.endswith(".gguf") and not base.startswith("mmproj")


def choose_file(files: list[str], quant: str | None = None) -> str:
    """The GGUF of ``files`` llama.cpp's ``-hf REPO[:QUANT]`` takes: the first carrying ``quant``
    (case-insensitive; default :data:`DEFAULT_QUANT`, and then the first GGUF when none carries it)."""
    ggufs = sorted(f for f in files if _is_model_gguf(f))
    targets = [f for f in ggufs if not _is_assistant(f, ggufs)] or ggufs
    if not targets:
        raise HubFileNotFoundError("the repository holds no GGUF file")
    want = (quant or DEFAULT_QUANT).lower()
    match = next((f for f in targets if want in f.rsplit("/", 1)[-1].lower()), None)
    if match is not None:
        return match
    if quant is not None:
        raise HubFileNotFoundError(f"no GGUF for quant {quant!r} in the repository (it has: {', '.join(targets)})")
    return targets[0]


def match_file(files: list[str], pattern: str) -> str:
    """The one file of ``files`` that the glob ``pattern`` names (llama-cpp-python's ``filename``)."""
    found = sorted(f for f in files if fnmatch.fnmatch(f, pattern))
    if not found:
        raise HubFileNotFoundError(f"no file matches {pattern!r} in the repository "
                                   f"(it has: {', '.join(sorted(files))})")
    if len(found) > 1:
        raise HubFileNotFoundError(f"{pattern!r} matches several files ({', '.join(found)}): name one")
    return found[0]


def _is_assistant(name: str, files: list[str]) -> bool:
    return any(assistant_name(other, [name]) == name for other in files if other != name)


def assistant_name(target: str, files: list[str]) -> str | None:
    """The file of ``files`` named as ``target``'s MTP assistant, or None."""
    folder = target.rsplit("/", 1)[0] + "/" if "/" in target else ""
    present = set(files)
    for candidate in assistant_candidates(target.rsplit("/", 1)[-1]):
        if folder + candidate.name in present:
            return folder + candidate.name
    return None


def list_files(repo_id: str, *, revision: str | None = None, token: str | None = None) -> list[str]:
    """The files of a hub model repository."""
    hub = huggingface_hub()
    try:
        return list(hub.list_repo_files(repo_id, revision=revision, token=token))
    except Exception as e:  # huggingface_hub's errors, whatever its version: typed here
        raise _typed(e, f"cannot list the files of {repo_id}") from e


def download(repo_id: str, filename: str, *, revision: str | None = None, token: str | None = None,
             cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The local path of ``filename`` of ``repo_id`` (downloaded into the cache unless there)."""
    hub = huggingface_hub()
    try:
        return Path(hub.hf_hub_download(repo_id, filename, revision=revision, token=token, cache_dir=cache_dir))
    except Exception as e:
        raise _typed(e, f"cannot download {filename} from {repo_id}") from e


def resolve(repo: str, filename: str | None = None, *, assistant: bool | str | None = None,
            revision: str | None = None, token: str | None = None,
            cache_dir: str | os.PathLike[str] | None = None) -> tuple[Path, Path | None]:
    """Download a target (``filename``: a name, a glob, or None for ``repo``'s ``:QUANT`` rule) and
    its assistant (``assistant``: a name or glob; True: the one named like the target, if the
    repository has it; None/False: none). Returns their local paths."""
    repo_id, quant = parse_repo(repo)
    files: list[str] | None = None

    def listing() -> list[str]:
        nonlocal files
        if files is None:
            files = list_files(repo_id, revision=revision, token=token)
        return files

    if filename is None:
        target = choose_file(listing(), quant)
    elif any(c in filename for c in "*?["):
        target = match_file(listing(), filename)
    else:
        target = filename
    helper: str | None = None
    if assistant is True:
        helper = assistant_name(target, listing())
    elif isinstance(assistant, str):
        helper = match_file(listing(), assistant) if any(c in assistant for c in "*?[") else assistant
    get: dict[str, Any] = dict(revision=revision, token=token, cache_dir=cache_dir)
    target_path = download(repo_id, target, **get)
    return target_path, (download(repo_id, helper, **get) if helper else None)


def _typed(e: Exception, what: str) -> HubError:
    if isinstance(e, HubError):
        return e
    names = {c.__name__ for c in type(e).__mro__}
    if names & set(_NOT_FOUND):
        return HubFileNotFoundError(f"{what}: {e}")
    return HubError(f"{what}: {e}")
