"""Loading for the commands: which files, the model with its assistant, a context on it.

One job: turn the model flags into a loaded :class:`~mtp_bindings.Model` (and a context),
saying once what was chosen (an assistant found beside the model, or none), with Ctrl-C
stopping a load cleanly (see :mod:`.interrupt`).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .. import models
from ..exceptions import AssistantLoadError, ModelLoadError
from ..config.limits import default_n_ctx
from .args import CONTEXT_DEFAULTS
from .flags import PROG, CLIError, flag
from .interrupt import Interrupt
from .upstream import SPEC_MTP, check_draft_n_min, check_draft_threads, wants_mtp


def model_files(args: argparse.Namespace) -> tuple[Path, Path | None, bool, str | None]:
    """The target, the assistant to attach (None: plain decoding), whether it must fit (the user
    named it, or asked for MTP with ``--spec-type draft-mtp``), and a note to say once (None:
    nothing worth saying)."""
    if getattr(args, "hf_repo", None) is not None or getattr(args, "hf_file", None) is not None:
        return hub_files(args)
    target = args.model or models.TARGET
    mtp = wants_mtp(args)
    if mtp is False:
        return target, None, False, None
    if args.mtp_head is not None:
        return target, args.mtp_head, True, None
    found = models.find_assistant(target)
    if found is None:
        looked = ", ".join(c.name for c in models.assistant_candidates(target)[:2])
        if mtp:
            raise CLIError(f"{flag(args, 'spec_type')} {SPEC_MTP} needs an MTP assistant: none given "
                           f"(--spec-draft-model or --mtp-head FILE) or found beside {target.name} (looked for "
                           f"{looked}, ...)")
        return target, None, False, (f"no MTP assistant given (--mtp-head) or found beside {target.name} "
                                     f"(looked for {looked}, ...): plain decoding")
    if args.model is None:
        return target, found, bool(mtp), None  # the bundled pair
    return target, found, bool(mtp), (f"attaching the MTP assistant found beside the model: {found} "
                                  "(--no-mtp for plain decoding)")


def hub_files(args: argparse.Namespace) -> tuple[Path, Path | None, bool, str | None]:
    """:func:`model_files` for ``-hf REPO[:QUANT]`` / ``--hf-file``: the target downloaded from the hub,
    and its assistant: ``--mtp-head`` when given, else the repository's file named like the target."""
    from ..hub import resolve

    if args.hf_repo is None:
        raise CLIError(f"{flag(args, 'hf_file')} names a file of --hf-repo: give -hf USER/MODEL too")
    if args.model is not None:
        raise CLIError(f"{flag(args, 'model')} and {flag(args, 'hf_repo')} both name the model: give one")
    no_mtp = getattr(args, "no_mtp", False)
    target, found = resolve(args.hf_repo, args.hf_file, assistant=not no_mtp and args.mtp_head is None,
                            token=args.hf_token)
    if no_mtp:
        return target, None, False, None
    if args.mtp_head is not None:
        return target, args.mtp_head, True, None
    if found is None:
        return target, None, False, f"{args.hf_repo} has no MTP assistant named like {target.name}: plain decoding"
    return target, found, False, f"attaching the MTP assistant of {args.hf_repo}: {found.name} (--no-mtp for plain " \
                                 "decoding)"


def _load_progress(target: Path, interrupt: Interrupt) -> Any:
    """The load's progress callback: a bar on a terminal, and either way stop on Ctrl-C."""
    if not sys.stderr.isatty():
        return interrupt.keep_loading
    from ..llama_model import _tqdm_progress

    bar = _tqdm_progress(f"loading {target.name}")

    def update(progress: float) -> bool:
        bar(progress)
        return interrupt.keep_loading(progress)

    return update


def load_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """The target's load arguments from the model flags (``-ngl``, ``--device``, ``--rpc``, ``--no-mmap``,
    ``-v``); the assistant's placement (``-ngld``, ``-devd``) follows them unless given."""
    return dict(n_gpu_layers=args.n_gpu_layers, devices=args.device, rpc_servers=args.rpc, use_mmap=not args.no_mmap,
                verbose=args.verbose)


def context_kwargs(args: argparse.Namespace, model: Any) -> dict[str, Any]:
    """A context's arguments from the flags (``-c``, ``-t``, ``-tb``, ``-ctk``, ``-ctv``, the sliding-window
    layers' types, ``-fa``; ``-b``,
    ``-ub`` where the command has them)."""
    batch = {}
    if hasattr(args, "batch_size"):
        ubatch = min(CONTEXT_DEFAULTS.n_ubatch, args.batch_size) if args.ubatch_size is None else args.ubatch_size
        batch = {"n_batch": args.batch_size, "n_ubatch": ubatch}
        if model.has_assistant:
            _check_verify_rows(args)
    return dict(n_ctx=n_ctx(model, args), n_threads=args.threads, n_threads_batch=args.threads_batch,
                type_k=args.cache_type_k, type_v=args.cache_type_v, type_k_swa=args.cache_type_k_swa,
                type_v_swa=args.cache_type_v_swa, flash_attn=args.flash_attn, embeddings=model.has_assistant, **batch)


def _check_verify_rows(args: argparse.Namespace) -> None:
    """An MTP round verifies its drafts and the token before them in one decode, which must fit one
    batch: ``-b`` below that is refused (the library would split the decode and lose its rows)."""
    from ..generation.driver import draft_params  # the one rule for preset + count

    rows = draft_params(draft_n_max=args.draft_n_max, preset=args.preset).draft_n_max + 1
    if args.batch_size < rows:
        raise CLIError(f"{flag(args, 'batch_size')} {args.batch_size} is less than the {rows} tokens an MTP round "
                       f"verifies at once (the drafts, {flag(args, 'draft_n_max')} or --preset's, and one more): "
                       f"give {flag(args, 'batch_size')} {rows} or more, fewer drafts, or --no-mtp")


def load(args: argparse.Namespace, interrupt: Interrupt) -> Any:
    """Load the target and attach its assistant (see :func:`model_files`); Ctrl-C stops the
    load and raises ``KeyboardInterrupt`` once it is safe to."""
    from .. import Model

    check_draft_n_min(args)
    check_draft_threads(args)
    target, assistant, named, note = model_files(args)
    if args.rpc and args.n_gpu_layers == 0:
        # as in llama.cpp, --rpc only adds devices; -ngl is what puts layers on them
        print(f"{PROG}: note: --rpc without -ngl: no layers go to the RPC servers (-ngl 99 puts them all there)",
              file=sys.stderr)
    with interrupt.deferred(second_raises=False):
        try:
            model = Model(target, **load_kwargs(args), progress=_load_progress(target, interrupt))
        except ModelLoadError:
            if interrupt.requested:
                raise KeyboardInterrupt from None
            raise
        try:
            if assistant is not None and not interrupt.requested:
                model.attach_assistant(assistant, n_gpu_layers=args.n_gpu_layers_draft, devices=args.device_draft)
        except AssistantLoadError as e:
            if named:
                model.close()
                raise
            note = f"the MTP assistant found beside the model does not fit it ({e}): plain decoding"
        except BaseException:
            model.close()
            raise
    if interrupt.requested:
        model.close()
        raise KeyboardInterrupt
    if note:
        print(f"{PROG}: note: {note}", file=sys.stderr)
    if args.verbose:
        _print_load_info(model)
    return model


def _print_load_info(model: Any) -> None:
    """``-v``: what was loaded, in a few lines on stderr."""
    print(f"model      {model.path}: {model.summary()}", file=sys.stderr)
    if model.assistant_path is None:
        print("assistant  none: plain decoding", file=sys.stderr)
        return
    from ..gguffile.tools import describe_assistant_head

    print(f"assistant  {model.assistant_path}: {describe_assistant_head(model.assistant_path)}", file=sys.stderr)


def n_ctx(model: Any, args: argparse.Namespace) -> int:
    if args.ctx_size is None:
        return default_n_ctx(model.n_ctx_train)
    if args.ctx_size == 0 and model.n_ctx_train > 0:
        return model.n_ctx_train
    return args.ctx_size


@contextlib.contextmanager
def session(args: argparse.Namespace, interrupt: Interrupt) -> Iterator[tuple[Any, Any]]:
    """The loaded model and a context on it, closed on exit. Ctrl-C while they are set up (llama.cpp
    logs through a Python callback all along) stops there with ``KeyboardInterrupt``."""
    with load(args, interrupt) as model:
        with interrupt.deferred(second_raises=False):
            ctx = model.create_context(**context_kwargs(args, model))
            if getattr(args, "draft_threads", None) is not None and model.has_assistant:
                ctx.set_mtp_threads(args.draft_threads)  # -td, kept by every generation on ctx
        with ctx:
            if interrupt.requested:
                raise KeyboardInterrupt
            yield model, ctx


# text that only a Jinja template's source holds (llama.cpp's --chat-template takes a template's text too)
JINJA_MARKS = ("{%", "{{")


def chat_template(args: argparse.Namespace) -> str | None:
    """The chat template ``--chat-template`` / ``--chat-template-file`` ask for (None: the GGUF's): the
    name of one of llama.cpp's built-in formats as it is, a Jinja template's text as it is, else the
    text of the file it names."""
    value, path = args.chat_template, args.chat_template_file
    if value is not None and path is not None:
        raise CLIError(f"{flag(args, 'chat_template')} and {flag(args, 'chat_template_file')} both name a chat "
                       "template: give one")
    if value is None and path is None:
        return None
    if value is not None:
        from ..chat.builtin_templates import builtin_template_names

        if value in builtin_template_names() or any(mark in value for mark in JINJA_MARKS):
            return value
        if not Path(value).is_file():
            raise CLIError(f"{flag(args, 'chat_template')} {value}: no such file, and not one of llama.cpp's built-in "
                           f"chat templates: {', '.join(builtin_template_names())}")
        path = Path(value)
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        which = 'chat_template' if value is not None else 'chat_template_file'
        raise CLIError(f"{flag(args, which)}: cannot read {path}: {e}") from None
