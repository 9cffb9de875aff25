"""A failed step of a run, as speedrun.sh records it: failed.json in the run directory with
the stage (training, evaluation, lm-eval, diagnostics), the exit status, the log and the line of the
log that says why. The report shows it as the run's status; speedrun removes it before the
next attempt.

    python -m nanochat.cluster.failure RUN_DIR STAGE LOG EXIT_STATUS
"""

import json
import re
import sys
from pathlib import Path

# Python's last traceback line ("ValueError: ..."), or a C++ runtime's abort message.
EXCEPTION = re.compile(r"^([A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)\b.*|terminate called.*)$")


def reason(log_text):
    """The line that says why: our CLIs' last `error:` line, else the last exception line,
    else the last line written; None for an empty log."""
    lines = [line.strip() for line in log_text.splitlines() if line.strip()]
    for pattern in (lambda line: line.startswith("error:"), EXCEPTION.match):
        found = [line for line in lines if pattern(line)]
        if found:
            return found[-1]
    return lines[-1] if lines else None


def record(run_dir, stage, log_path, exit_status):
    """Write failed.json for a step that exited with exit_status; return its reason."""
    log_path = Path(log_path)
    text = log_path.read_text(errors="replace") if log_path.is_file() else ""
    why = reason(text) or f"no output (see {log_path})"
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "failed.json").write_text(json.dumps(
        {"stage": stage, "exit_status": exit_status, "reason": why, "log": str(log_path)}, indent=1))
    return why


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 4 or not argv[3].lstrip("-").isdigit():
        sys.exit("error: usage: python -m nanochat.cluster.failure RUN_DIR STAGE LOG EXIT_STATUS")
    run_dir, stage, log, status = argv
    print(f"speedrun: {Path(run_dir).name} failed in {stage} (exit {status}): {record(run_dir, stage, log, int(status))}")


if __name__ == "__main__":
    main()
