"""What a user gets from `pip install git+...` or a wheel baked into a cluster's image: the sdist
and the wheel are built offline from this tree, the wheel is installed into a venv of its own
outside the tree, and from there, with the source tree off sys.path, every registered wiring
builds on both trunks and runs a forward, and `python -m scripts.base_train --help` runs.
Every other test imports the editable install, which finds any folder of the tree and so
cannot see a package the build leaves out (issue: `nanochat.connections.backends` missing
from the wheel made `import nanochat.gpt` fail)."""

import os
import shutil
import site
import subprocess
import sys
import tarfile
import venv
import zipfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytest.importorskip("build", reason="the dev extra's `build` builds the sdist and the wheel")

# Run inside the installed copy: every wiring the registry discovers there, on both trunks.
BUILD_EVERY_WIRING = """
import json, os, sys
import torch
import nanochat
from nanochat import connections
from nanochat.gpt import GPTConfig, build_model
from nanochat.trunks import TRUNKS
root = os.environ["SOURCE_TREE"]
assert not any(os.path.abspath(p or os.getcwd()) == root for p in sys.path), sys.path
built = []
for trunk in TRUNKS:
    for name in connections.VARIANTS:
        torch.manual_seed(0)
        config = GPTConfig(sequence_len=8, vocab_size=64, n_layer=2, n_head=2, n_kv_head=2, n_embd=32,
                           window_pattern="L", hc=name, trunk=trunk)
        model = build_model(config, "cpu")
        logits = model(torch.zeros(1, 8, dtype=torch.long))
        assert logits.shape == (1, 8, 64) and torch.isfinite(logits).all(), (trunk, name)
        built.append(name)
print(json.dumps({"package": os.path.dirname(nanochat.__file__), "built": sorted(set(built))}))
"""


def members(archive):
    if archive.endswith(".whl"):
        return zipfile.ZipFile(archive).namelist()
    return [name.split("/", 1)[1] for name in tarfile.open(archive).getnames() if "/" in name]


def package_folders(names):
    """Every folder holding an __init__.py among an archive's (or the tree's) paths."""
    return {os.path.dirname(name) for name in names if name.endswith("/__init__.py")}


def tree_files():
    """The tree's files as git sees them (tracked, and new ones it does not ignore)."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                            text=True)
    if listed.returncode != 0:
        pytest.skip("the tree's files come from git (`git ls-files`), and this tree is not a git checkout")
    return [path for path in listed.stdout.splitlines() if os.path.isfile(os.path.join(ROOT, path))]


def tree_packages():
    found = set()
    for top in ("nanochat", "scripts"):
        for folder, _, files in os.walk(os.path.join(ROOT, top)):
            if "__init__.py" in files:
                found.add(os.path.relpath(folder, ROOT).replace(os.sep, "/"))
    return found


@pytest.fixture(scope="module")
def dist(tmp_path_factory):
    """The sdist, then the wheel built from it (as pip does), offline, without isolation, from
    a copy of the tree as a fresh clone has it: the editable install's egg-info lists every
    file, and setuptools would ship a forgotten package from that list as data."""
    clone = tmp_path_factory.mktemp("clone")
    for path in tree_files():
        os.makedirs(clone / os.path.dirname(path), exist_ok=True)
        shutil.copy2(os.path.join(ROOT, path), clone / path)
    out = tmp_path_factory.mktemp("dist")
    built = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(clone)],
                           capture_output=True, text=True, cwd=clone)
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    files = {name.rsplit(".", 2)[-1] if name.endswith(".gz") else name.rsplit(".", 1)[-1]: str(out / name)
             for name in os.listdir(out)}
    return {"sdist": files["gz"], "wheel": files["whl"]}


@pytest.mark.parametrize("kind", ["sdist", "wheel"])
def test_every_package_folder_ships(dist, kind):
    shipped = package_folders(members(dist[kind]))
    assert tree_packages() <= shipped, f"{kind} leaves out {sorted(tree_packages() - shipped)}"


def test_the_installed_wheel_builds_every_wiring_on_both_trunks(dist, tmp_path):
    # A venv of its own whose site-packages reach the test venv's (torch and the rest) but
    # not the editable install's finder, which would map `nanochat` back to this tree.
    target = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(target)
    py = str(target / "bin" / "python")
    own_site = subprocess.run([py, "-c", "import site; print(site.getsitepackages()[0])"], check=True,
                              capture_output=True, text=True).stdout.strip()
    shared = [p for p in site.getsitepackages() if os.path.isdir(p)]
    with open(os.path.join(own_site, "test_venv.pth"), "w") as f:
        f.write("\n".join(shared) + "\n")
    with zipfile.ZipFile(dist["wheel"]) as wheel:
        wheel.extractall(own_site)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(SOURCE_TREE=ROOT, PYTHONNOUSERSITE="1", NANOCHAT_WIRINGS="")
    away = str(tmp_path)
    run = subprocess.run([py, "-c", BUILD_EVERY_WIRING], cwd=away, env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    import json
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["package"].startswith(own_site), result["package"]
    from nanochat import connections
    in_package = sorted(name for name in connections.VARIANTS if connections.in_package(name))
    assert result["built"] == in_package
    helped = subprocess.run([py, "-m", "scripts.base_train", "--help"], cwd=away, env=env, capture_output=True,
                            text=True)
    assert helped.returncode == 0 and "--depth" in helped.stdout, helped.stderr[-3000:]
