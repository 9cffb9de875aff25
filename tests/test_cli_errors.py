"""Bad input to every command-line entry point: each numeric flag walked through 0, -1 and
a wrong type at parse time (one `error:` line naming the flag, a non-zero exit), TOML keys
through the same checks, and the runtime mistakes (missing tokenizer, data, run) as real
processes that end in one `error:` line without a traceback, and the guard around main()."""

import contextlib
import errno
import importlib
import importlib.util
import io
import os
import sys

import launch
import pytest
import torch

from nanochat import cli
from nanochat.data.shards import DatasetError
from nanochat.tokenizer import Tokenizer
from nanochat.train_config import parse_args as train_parse_args

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# CLI -> (module whose build_parser() is the CLI's parser, argv that parses on its own).
# A CLI whose module does not exist (yet) is skipped.
CLIS = {
    "scripts.base_train": ("nanochat.train_config", []),  # its flags are the TOML keys' table
    "scripts.base_eval": ("scripts.base_eval", []),
    "scripts.tok_train": ("scripts.tok_train", []),
    "scripts.tok_eval": ("scripts.tok_eval", []),
    "scripts.hc_report": ("scripts.hc_report", ["--params"]),
    "scripts.bench": ("scripts.bench", []),
    "scripts.report": ("scripts.report", []),
    "scripts.compare": ("scripts.compare", []),
    "nanochat.dataset": ("nanochat.dataset", []),
    "scripts.gpu_check": ("scripts.gpu_check", []),
    "scripts.export": ("scripts.export", ["--out", "x"]),
    "scripts.lm_eval": ("scripts.lm_eval", []),
}

# The values among 0 and -1 that a numeric flag accepts, by what they mean; every other
# numeric flag must refuse both. "abc" is refused by all. A wiring's own fields are not listed
# here: their modules declare them (FIELD_TYPES, whose parsers state their range), see
# declared_allowed().
ALLOWED = {
    ("scripts.base_train", "--seed"): {"0"},
    ("scripts.base_train", "--vocab-size"): {"0"},  # 0: the trained tokenizer's size
    ("scripts.base_train", "--hc-streams"): {"0"},  # 0: the variant's default n
    ("scripts.base_train", "--hc-lr"): {"0"},  # a learning rate of 0 freezes the group
    ("scripts.base_train", "--scalar-lr"): {"0"},
    ("scripts.base_train", "--x0-beta1"): {"0"},  # Adam without momentum
    ("scripts.base_train", "--hc-lss-init"): {"0", "-1"},  # any finite start of the stream scales
    ("scripts.base_train", "--data-seed"): {"0", "-1"},  # -1: nanochat's fixed order
    ("scripts.base_train", "--embedding-lr"): {"0"},
    ("scripts.base_train", "--unembedding-lr"): {"0"},
    ("scripts.base_train", "--matrix-lr"): {"0"},
    ("scripts.base_train", "--weight-decay"): {"0"},
    ("scripts.base_train", "--warmup-ratio"): {"0"},  # fractions of the run
    ("scripts.base_train", "--warmup-steps"): {"0"},  # 0: by --warmup-ratio
    ("scripts.base_train", "--warmdown-ratio"): {"0"},
    ("scripts.base_train", "--final-lr-frac"): {"0"},
    ("scripts.base_train", "--hc-stats-every"): {"-1"},  # -1: never
    ("scripts.base_train", "--core-metric-every"): {"-1"},
    ("scripts.base_train", "--sample-every"): {"-1"},
    ("scripts.base_train", "--eval-every"): {"0", "-1"},  # 0: never, -1: only at the end
    ("scripts.base_train", "--save-every"): {"-1"},  # -1: only at the end
    ("scripts.base_train", "--core-metric-max-per-task"): {"-1"},  # -1: all
    ("scripts.base_train", "--num-iterations"): {"-1"},  # -1: from the flops or the data ratio
    ("scripts.base_train", "--target-flops"): {"-1"},  # -1: unused
    ("scripts.base_train", "--target-param-data-ratio"): {"-1"},
    ("scripts.base_train", "--keep-checkpoints"): {"0", "-1"},  # 0: latest and final only, -1: all
    ("scripts.base_eval", "--step"): {"0"},
    ("scripts.base_eval", "--max-per-task"): {"-1"},  # -1: all
    ("scripts.hc_report", "--step"): {"0"},
    ("scripts.hc_report", "--seed"): {"0"},
    ("scripts.bench", "--width"): {"0"},  # 0: from the depth
    ("scripts.bench", "--warmup"): {"0"},
    ("scripts.bench", "--seed"): {"0"},
    ("scripts.bench", "--profile"): {"0"},  # 0: no profile
    ("scripts.export", "--step"): {"0"},
    ("scripts.lm_eval", "--step"): {"0"},
    ("scripts.lm_eval", "--num-fewshot"): {"0"},  # zero-shot
    ("scripts.lm_eval", "--bootstrap-iters"): {"0"},  # no bootstrap for non-mean metrics
    ("nanochat.dataset", "--num-files"): {"0", "-1"},  # 0: the val shard only, -1: all
    ("nanochat.dataset", "--shuffle-seed"): {"0"},
}


def in_declared_range(declared, value):
    """Whether a parser's stated range (flags.py: minimum, maximum, multiple, special values)
    holds `value`."""
    if value in declared["special"]:
        return True
    low = declared["minimum"]
    above = low is None or (value > low if declared["above"] else value >= low)
    below = declared["maximum"] is None or value <= declared["maximum"]
    return above and below and (declared["multiple"] is None or value % declared["multiple"] == 0)


def declared_allowed():
    """base_train's entries of ALLOWED for every wiring's numeric fields, read from the
    modules' declarations (FIELD_TYPES, or the parser of the default's type)."""
    from nanochat.train_config import variant_flags
    allowed = {}
    for name, parser, _, _ in variant_flags():
        if not getattr(parser, "numeric", False):
            continue
        assert hasattr(parser, "declared"), f"{name}: a wiring's numeric field needs a parser from nanochat/flags.py"
        allowed[("scripts.base_train", "--" + name.replace("_", "-"))] = {
            v for v in ("0", "-1") if in_declared_range(parser.declared, int(v))}
    return allowed


def cli_parser(cli):
    module_name, base_argv = CLIS[cli]
    if importlib.util.find_spec(module_name) is None:
        pytest.skip(f"{module_name} does not exist")
    module = importlib.import_module(module_name)
    if not hasattr(module, "build_parser"):
        pytest.skip(f"{module_name} has no build_parser()")
    return module.build_parser(), base_argv


def numeric_flags(parser):
    """{long flag: action} of the flags whose values are numbers."""
    return {max(a.option_strings, key=len): a for a in parser._actions
            if a.option_strings and (getattr(a.type, "numeric", False) or a.type in (int, float))}


def parse(parse_args, argv):
    """(exit code or None, stderr) of parse_args(argv) in-process."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            parse_args(argv)
        except SystemExit as e:
            return e.code, err.getvalue()
    return None, err.getvalue()


def test_a_wirings_fields_are_allowed_what_their_module_declares():
    """0 where a module gives it a meaning (attnres' block size, gated's rank, mhar's heads) or
    its range holds it (cmhc's beta >= 0); -1 nowhere; a positive field neither."""
    allowed = declared_allowed()
    for flag, values in (("--attnres-block-size", {"0"}), ("--cmhc-beta", {"0"}), ("--gated-rank", {"0"}),
                         ("--mhar-heads", {"0"}), ("--dwa-dilation", set()), ("--laurel-rank", set())):
        assert allowed[("scripts.base_train", flag)] == values, flag


@pytest.mark.parametrize("cli", list(CLIS))
def test_every_numeric_flag_refuses_zero_negative_and_wrong_type(cli):
    parser, base = cli_parser(cli)
    flags = numeric_flags(parser)
    assert flags or cli == "scripts.report", f"{cli}: no numeric flag found"
    problems = []
    listed = {**ALLOWED, **declared_allowed()}
    for flag, action in flags.items():
        allowed = listed.get((cli, flag), set())
        for value in ("0", "-1", "abc"):
            code, err = parse(parser.parse_args, [*base, flag, value])
            if value in allowed:
                if code is not None:
                    problems.append(f"{flag} {value}: allowed but refused: {err.strip()}")
                continue
            error_lines = [line for line in err.splitlines() if "error:" in line]
            names = any(opt in line for opt in action.option_strings for line in error_lines)
            if not code or len(error_lines) != 1 or not names or "Traceback" in err:
                problems.append(f"{flag} {value}: exit {code}, stderr {err.strip()!r}")
    stale = [flag for c, flag in ALLOWED if c == cli and flag not in flags]
    assert not stale, f"{cli}: the allow-list names flags the parser lacks: {stale}"
    assert not problems, f"{cli}:\n" + "\n".join(problems)


def test_toml_keys_get_the_same_checks(tmp_path):
    for text, key in [("depth = 0\n", "depth"), ("device_batch_size = -4\n", "device_batch_size"),
                      ("max_seq_len = \"long\"\n", "max_seq_len"), ("eval_tokens = 2.5\n", "eval_tokens"),
                      ("warmdown_ratio = 1.5\n", "warmdown_ratio"), ("hc_factors = [2, 1]\n", "hc_factors"),
                      ("matrix_lr = nan\n", "matrix_lr")]:
        path = tmp_path / "bad.toml"
        path.write_text(text)
        with pytest.raises(SystemExit, match=f"error: .*bad value for {key}: expected"):
            train_parse_args(["--config", str(path)])
    path.write_text("eval_tokens = 1e6\nkeep_checkpoints = -1\neval_every = 0\n")
    args = train_parse_args(["--config", str(path)])
    assert (args.eval_tokens, args.keep_checkpoints, args.eval_every) == (1_000_000, -1, 0)


def test_combinations_paths_and_choices_are_checked_at_parse_time():
    code, err = parse(train_parse_args, ["--warmup-ratio", "0.7", "--warmdown-ratio", "0.4"])
    assert code == 2 and "at most 1" in err
    code, err = parse(train_parse_args, ["--data-dir", "/no/such/dir"])
    assert code == 2 and "--data-dir" in err and "not a directory" in err
    code, err = parse(train_parse_args, ["--device-type", "gpu"])
    assert code == 2 and "--device-type" in err and "'cuda'" in err
    code, err = parse(train_parse_args, ["--head-dim", "7"])
    assert code == 2 and "--head-dim" in err and "even" in err
    assert parse(train_parse_args, ["--eval-tokens", "2e6", "--head-dim", "64", "--warmup-ratio", "0.25",
                                    "--matrix-lr", "0.01", "--hc-factors", "4x2"]) == (None, "")


# ----------------------------------------------------------------------------- real processes

def run_cli(module, *args, base):
    env = dict(os.environ, NANOCHAT_BASE_DIR=str(base), OMP_NUM_THREADS="1", WANDB_MODE="disabled",
               NANOCHAT_DTYPE="float32", CUDA_VISIBLE_DEVICES="", PYTHONPATH=REPO)
    return launch.run([sys.executable, "-m", module, *args], cwd=REPO, env=env, capture_output=True,
                      text=True, timeout=120)


def assert_one_error(proc, *phrases):
    err = proc.stderr
    assert proc.returncode != 0 and "Traceback" not in err, err[-2000:]
    lines = [line for line in err.splitlines() if line.startswith("error:") or ": error:" in line]
    assert len(lines) == 1, err[-2000:]
    for phrase in phrases:
        assert phrase in err, (phrase, err[-2000:])


TRAIN = ["--depth", "1", "--aspect-ratio", "32", "--head-dim", "32", "--max-seq-len", "32", "--device-batch-size",
         "2", "--total-batch-size", "64", "--num-iterations", "1", "--core-metric-every", "-1", "--sample-every", "-1",
         "--device-type", "cpu"]


@pytest.mark.slow
def test_runtime_mistakes_end_in_one_error_line(tmp_path, small_corpus_dir, tokenizer_dir):
    empty = tmp_path / "empty"
    empty.mkdir()
    # no tokenizer
    assert_one_error(run_cli("scripts.base_train", *TRAIN, base=empty), "no trained tokenizer", "scripts.tok_train")
    # a tokenizer but no data
    only_tok = tmp_path / "only_tok"
    only_tok.mkdir()
    os.symlink(tokenizer_dir, only_tok / "tokenizer")
    assert_one_error(run_cli("scripts.base_train", *TRAIN, base=only_tok), "no shards in", "nanochat.dataset")
    # a tokenizer of another size than the config asks for
    assert_one_error(run_cli("scripts.base_train", *TRAIN, "--vocab-size", "4096", "--data-dir", small_corpus_dir,
                             base=only_tok), "vocab_size=4096", "--vocab-size 4096")
    # a device the machine lacks
    assert_one_error(run_cli("scripts.base_train", *TRAIN, "--device-type", "cuda", base=empty), "no CUDA device")
    # evaluation of a run that does not exist; a report of no runs
    assert_one_error(run_cli("scripts.base_eval", "--model-tag", "nope", "--eval", "bpb", base=empty),
                     "no run directory", "--model-tag nope")
    # a run resumed under a tokenizer of another size
    only_tok.joinpath("tokenizer").unlink()
    os.symlink(tokenizer_dir, only_tok / "tokenizer")
    train = [*TRAIN, "--data-dir", small_corpus_dir, "--eval-every", "-1", "--model-tag", "r"]
    assert run_cli("scripts.base_train", *train, base=only_tok).returncode == 0
    other = tmp_path / "other_tok"
    small = Tokenizer.train_from_iterator(["a small text to learn a few merges from"] * 4, 300)
    small.save(str(other))
    only_tok.joinpath("tokenizer").unlink()
    os.symlink(other, only_tok / "tokenizer")
    assert_one_error(run_cli("scripts.base_train", *train, "--resume", "true", base=only_tok),
                     "512-token", f"has {small.get_vocab_size()};", "the run's own tokenizer")
    assert_one_error(run_cli("scripts.report", "--runs-root", str(empty), base=empty), "no run directories")


def guarded(exc):
    """(exit code, stderr) of cli.run around a main() that raises `exc`."""
    def main():
        raise exc
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as e:
        cli.run(main)
    return e.value.code, err.getvalue()


def test_the_guard_turns_user_errors_into_one_line_and_keeps_bugs_loud():
    assert guarded(DatasetError("no shards in /x: run it")) == (1, "error: no shards in /x: run it\n")
    assert guarded(FileNotFoundError("no trained tokenizer in /t")) == (1, "error: no trained tokenizer in /t\n")
    code, err = guarded(OSError(errno.ENOSPC, "No space left on device", "/runs/r/model_000004.pt"))
    assert code == 1 and err.startswith("error: no space left") and "model_000004.pt" in err
    code, err = guarded(torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB\nmore"))
    assert code == 1 and err.count("\n") == 1 and "--device-batch-size" in err and "Tried to allocate" in err
    assert guarded(KeyboardInterrupt()) == (130, "error: interrupted\n")
    assert guarded(SystemExit("base_eval: no run")) == (1, "error: base_eval: no run\n")
    with pytest.raises(SystemExit) as e:  # already prefixed: Python prints it as it is
        cli.run(lambda: sys.exit("error: done"))
    assert e.value.code == "error: done"
    with pytest.raises(ZeroDivisionError):  # a bug keeps its traceback
        cli.run(lambda: 1 / 0)


def test_the_guard_tells_every_failure_to_on_error_first():
    heard = []
    for main, raised in ((lambda: sys.exit("error: disk full"), SystemExit),
                         (lambda: (_ for _ in ()).throw(DatasetError("corrupt shard")), SystemExit),
                         (lambda: 1 / 0, ZeroDivisionError),
                         (lambda: sys.exit(75), SystemExit)):  # an exit status asked for: not a failure
        with contextlib.redirect_stderr(io.StringIO()), pytest.raises(raised):
            cli.run(main, on_error=lambda line, code: heard.append((line, code)))
    assert heard == [("error: disk full", 1), ("error: corrupt shard", 1),
                     ("error: ZeroDivisionError: division by zero", 1)]
