"""Every citation of a section of the project's own pages (`README "Two commands"`,
`docs/connections.md, "Adding a wiring"`) in the code, the tests, the configs and the pages
themselves names a heading that exists: a page that changes its headings cannot leave a
pointer to nowhere. And the commands docs/connections.md gives to try a new wiring run as
written."""

import re
import shlex
import sys
from pathlib import Path

import launch
import pytest

from test_train_e2e import base, env_for  # noqa: F401 (a fixture)

REPO = Path(__file__).resolve().parent.parent
SEARCHED = ["nanochat/**/*.py", "scripts/*", "tests/*.py", "configs/**/*.toml", "docs/*.md", "README.md", "speedrun.sh"]
# a page, an optional comma, then the section's title in quotes (it may wrap onto a comment line)
CITATION = re.compile(r"""\b(README(?:\.md)?|(?:docs/)?[\w-]+\.md),? (["'])([^"'\n]+(?:\n\s*#?\s*[^"'\n]+)?)\2""")


def page(name, cited_from):
    if name.startswith("README"):
        return REPO / "README.md"
    path = REPO / name if name.startswith("docs/") else cited_from.parent / name
    return path if path.is_file() else REPO / "docs" / name


def headings(path):
    return [line.lstrip("#").strip() for line in path.read_text().splitlines() if line.startswith("#")]


def citations():
    """(file, page, title) of every citation of a section."""
    found = []
    for pattern in SEARCHED:
        for path in sorted(REPO.glob(pattern)):
            if not path.is_file():
                continue
            for match in CITATION.finditer(path.read_text(errors="replace")):
                title = re.sub(r"\s*\n\s*#?\s*", " ", match.group(3)).strip()
                found.append((path.relative_to(REPO), page(match.group(1), path), title))
    return found


def test_every_cited_section_exists():
    found = citations()
    assert len(found) >= 10  # the pattern still finds the citations
    missing = [f"{where}: {target.relative_to(REPO) if target.is_file() else target} has no section {title!r}"
               for where, target, title in found
               if not target.is_file() or not any(h.startswith(title) for h in headings(target))]
    assert not missing, "\n".join(missing)


def test_a_citation_wrapped_onto_a_comment_line_is_read_whole():
    text = '# the CUDA dry run (README "On a fresh' + '\n# machine"): PyPI build'  # split: not a citation here
    title = re.sub(r"\s*\n\s*#?\s*", " ", CITATION.search(text).group(3))
    assert title == "On a fresh machine"


def documented_commands(page="docs/connections.md", section="### Trying it"):
    """The lines of the first bash block of a page's section."""
    text = (REPO / page).read_text()
    block = text[text.index(section):].split("```bash\n", 1)[1].split("```", 1)[0]
    return [line for line in block.splitlines() if line.strip()]


@pytest.mark.slow
def test_the_documented_tiny_run_of_a_new_wiring_runs_as_written(base):  # noqa: F811 (the fixture)
    """With NAME a wiring and the base directory a test's (tokenizer and shards as the CPU
    demo leaves them), each command runs to its end."""
    lines = documented_commands()
    assert lines[0].startswith("export NANOCHAT_BASE_DIR=") and len(lines) == 3
    outputs = []
    for line in lines[1:]:
        argv = shlex.split(line.replace("NAME", "laurel"))
        assert argv[:2] == ["python", "-m"]
        proc = launch.run([sys.executable, *argv[1:]], cwd=REPO, env=env_for(base), capture_output=True,
                          text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        outputs.append(proc.stdout)
    assert "step 00010 | val bpb" in outputs[0] and "try_laurel" in outputs[1] and "wrote" in outputs[1]
