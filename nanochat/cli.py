"""What every command-line entry point shares: the argparse types of nanochat/flags.py
(re-exported here), and the guard around main() that turns a user's mistake found later
(missing tokenizer or data, a full disk, Ctrl-C) into one `error:` line and a non-zero exit
instead of a traceback."""

import errno
import importlib.util
import os
import sys

from nanochat.flags import (boolean, choice, existing_dir, existing_path, factor_list, finite_float,  # noqa: F401
                            fraction, int_at_least, int_in, nonneg_float, nonneg_int, positive_even_int,
                            positive_float, positive_int)


def run_dir_flags(parser, what):
    """--model-tag, --run-dir and --step: which checkpoint a command reads."""
    parser.add_argument("--model-tag", type=str, default=None, help=f"run to {what}: base_dir()/runs/<tag>")
    parser.add_argument("--run-dir", type=existing_dir, default=None, help="run directory (instead of --model-tag)")
    parser.add_argument("--step", type=nonneg_int(), default=None, help="checkpoint step (default: the latest)")


def resolve_run_dir(parser, args):
    """The run directory that --run-dir or --model-tag names (a parser error naming the fix
    when neither names an existing one)."""
    if args.run_dir is not None:
        return args.run_dir
    if args.model_tag is None:
        parser.error("name the run with --model-tag TAG (base_dir()/runs/TAG) or --run-dir DIR")
    from nanochat.checkpoint_manager import run_dir_for

    run_dir = run_dir_for(args.model_tag)
    if not os.path.isdir(run_dir):
        parser.error(f"argument --model-tag: no run directory {run_dir}; train it with "
                     f"`python -m scripts.base_train --model-tag {args.model_tag}`")
    return run_dir


def require_extra(extra, *modules):
    """One error line naming the install command when an optional extra's modules are missing."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        fail(f"{', '.join(missing)} not installed: this command needs the {extra} extra "
             f"(pip install -e '.[{extra}]')")


def fail(message, code=1):
    """End the process with one `error:` line on stderr."""
    print(f"error: {message}", file=sys.stderr, flush=True)
    sys.exit(code)


def _failure(e):
    """(message, exit code, is a bug) for an exception that ends a CLI; None for a SystemExit
    with a number (or none), which exits as asked."""
    if isinstance(e, SystemExit):
        return (e.code.removeprefix("error: "), 1, False) if isinstance(e.code, str) else None
    if isinstance(e, KeyboardInterrupt):
        return "interrupted", 130, False
    from nanochat.data.shards import DatasetError
    if isinstance(e, OSError) and e.errno == errno.ENOSPC:
        return f"no space left on the device ({e.filename or e}): free disk space and run again", 1, False
    torch = sys.modules.get("torch")  # loaded by every command that can run out of GPU memory
    if torch is not None and isinstance(e, torch.cuda.OutOfMemoryError):
        return (f"out of GPU memory ({str(e).splitlines()[0]}): lower the batch size (--device-batch-size; "
                "gradient accumulation keeps the total batch) or the sequence length", 1, False)
    if isinstance(e, (DatasetError, OSError)):
        return str(e), 1, False
    # a wiring's declaration that does not hold (its message names the fix): the wiring's
    # author's to fix, not a bug of the command (loaded by whatever read the registry)
    spec = sys.modules.get("nanochat.connections.spec")
    if spec is not None and isinstance(e, spec.SpecError):
        return str(e), 1, False
    return f"{type(e).__name__}: {e}", 1, True


def run(main, on_error=None):
    """Call main() with no arguments; a failure that is the user's to fix ends in one
    `error:` line: missing or corrupt data (DatasetError), a missing file or directory,
    permissions, a full disk, GPU memory exhausted, a wiring's declaration that does not hold
    (SpecError), Ctrl-C, and SystemExit messages.
    Anything else is a bug and keeps its traceback. on_error(line, exit code), when given,
    hears every failure first (base_train passes it on to its other ranks)."""
    try:
        main()
    except BaseException as e:
        found = _failure(e)
        if found is None:
            raise
        message, code, bug = found
        if on_error is not None:
            on_error(f"error: {message}", code)
        if bug or (isinstance(e, SystemExit) and e.code.startswith("error:")):
            raise  # a bug keeps its traceback; a message with the prefix prints as it is
        fail(message, code)
