"""Fill an Ollama source tree's vendor/ from bare git mirrors, for a build with no module proxy.

`go build -mod=vendor` reads vendor/modules.txt and never asks a proxy or checks go.sum, so
each module of go.mod's require lists is laid out from a bare mirror of its repository
(/work/.mirror/<owner>+<name>/repo, as the search tool's `fetch github:<owner>/<name>` leaves
it) at the tag or commit that go.mod names. Modules whose packages the binary does not import
(test-only ones) may have no mirror: they are listed with no packages. Blobs a snapshot left
out (big generated files and test data) are left out with a word. Run by
loadtest/build_real_ollama.sh:

    python loadtest/real_ollama_vendor.py /tmp/real-ollama/ollama-v0.12.6
"""

from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
import sys
import tarfile

MIRRORS = os.environ.get("MIRRORS", "/work/.mirror")

# Module paths not at github.com/<owner>/<name>: mirror name and folder in the repository.
ELSEWHERE = {
    "google.golang.org/protobuf": ("protocolbuffers+protobuf-go", ""),
    "gonum.org/v1/gonum": ("gonum+gonum", ""),
    "gopkg.in/yaml.v3": ("go-yaml+yaml", ""),
    "go4.org/unsafe/assume-no-moving-gc": ("go4org+unsafe-assume-no-moving-gc", ""),
    "gorgonia.org/vecf32": ("gorgonia+vecf32", ""),
    "gorgonia.org/vecf64": ("gorgonia+vecf64", ""),
}

# Snapshots that lack the exact tag: the nearest older release (vendor mode does not verify
# content; a patch release's API is the same).
NEAREST = {"github.com/pelletier/go-toml/v2": "v2.2.0"}


def locate(module: str) -> tuple[str, str]:
    """The mirror name and the folder inside that repository of a module path."""
    if module.startswith("golang.org/x/"):
        return "golang+" + module.split("/")[2], ""
    if module in ELSEWHERE:
        return ELSEWHERE[module]
    parts = module.split("/")
    if parts[0] != "github.com":
        raise SystemExit(f"no mirror rule for {module}: add it to ELSEWHERE")
    folder = [p for p in parts[3:] if not re.fullmatch(r"v\d+", p)]  # /vN is no folder
    return f"{parts[1]}+{parts[2]}", "/".join(folder)


def git_ref(module: str, version: str, folder: str) -> str:
    """A pseudo-version's commit, else the tag (prefixed by the folder for a nested module)."""
    if module in NEAREST:
        return NEAREST[module]
    version = version.removesuffix("+incompatible")
    if m := re.search(r"-([0-9a-f]{12})$", version):
        return m.group(1)
    return f"{folder}/{version}" if folder else version


def requirements(go_mod: str) -> list[tuple[str, str]]:
    """(module, version) of every require line of a go.mod."""
    out, block = [], False
    with open(go_mod, encoding="utf-8") as f:
        text = f.read()
    for line in text.splitlines():
        s = line.split("//")[0].strip()
        if s == "require (":
            block = True
        elif block and s == ")":
            block = False
        elif block and s:
            module, version = s.split()[:2]
            out.append((module, version))
        elif s.startswith("require "):
            module, version = s.split()[1:3]
            out.append((module, version))
    return sorted(out)


def _git(gitdir: str, *args: str, data: str | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", f"--git-dir={gitdir}", *args], capture_output=True,
                          input=data.encode() if data is not None else None, check=False)


def missing_blobs(gitdir: str, ref: str, folder: str) -> list[str]:
    """Paths (relative to the folder) whose blobs the snapshot does not hold."""
    rows = [line.split(None, 3) for line in _git(gitdir, "ls-tree", "-r", ref, "--",
                                                 folder or ".").stdout.decode().splitlines()]
    rows = [r for r in rows if r[1] == "blob"]
    check = _git(gitdir, "cat-file", "--batch-check", data="\n".join(r[2] for r in rows))
    cut = len(folder) + 1 if folder else 0
    return [r[3][cut:] for r, c in zip(rows, check.stdout.decode().splitlines(), strict=True)
            if c.endswith("missing")]


def lay_out(gitdir: str, ref: str, folder: str, dest: str) -> str:
    """Extract ref:folder into dest; an error text, or "" when done."""
    tree = f"{ref}:{folder}"
    got = _git(gitdir, "archive", "--format=tar", tree)
    if got.returncode and b"invalid object" in got.stderr:
        gone = missing_blobs(gitdir, ref, folder)
        print(f"  {dest}: leaving out {len(gone)} blob(s) the snapshot lacks: {gone[:4]}")
        got = _git(gitdir, "archive", "--format=tar", tree, "--", ".",
                   *[f":(exclude){g}" for g in gone])
    if got.returncode:
        return got.stderr.decode().strip()[:160]
    os.makedirs(dest, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(got.stdout)) as tar:
        tar.extractall(dest, filter="fully_trusted")
    for root, dirs, files in os.walk(dest, topdown=True):
        if root != dest and "go.mod" in files:  # a nested module is not part of this one
            shutil.rmtree(root)
            dirs[:] = []
    return ""


def packages(vendor: str, dest: str) -> list[str]:
    out = []
    for root, dirs, files in os.walk(dest):
        dirs[:] = sorted(d for d in dirs if d != "testdata" and not d.startswith((".", "_")))
        if any(f.endswith(".go") and not f.endswith("_test.go") for f in files):
            out.append(os.path.relpath(root, vendor))
    return sorted(out)


def go_version(dest: str) -> str:
    path = os.path.join(dest, "go.mod")
    if not os.path.exists(path):
        return ""
    with open(path, encoding="utf-8") as f:
        m = re.search(r"^go (\d+\.\d+)", f.read(), re.M)
    return m.group(1) if m else ""


def vendor(src: str) -> list[str]:
    """Lay out vendor/ and write modules.txt; the modules that could not be laid out."""
    vendor_dir = os.path.join(src, "vendor")
    shutil.rmtree(vendor_dir, ignore_errors=True)
    lines, problems = [], []
    for module, version in requirements(os.path.join(src, "go.mod")):
        name, folder = locate(module)
        gitdir = os.path.join(MIRRORS, name, "repo")
        if os.path.isdir(gitdir + "/.git"):
            gitdir += "/.git"
        dest = os.path.join(vendor_dir, module)
        if not os.path.isdir(gitdir):
            repo = name.replace("+", "/")
            problems.append(f"{module}@{version}: no mirror (fetch github:{repo})")
        elif err := lay_out(gitdir, git_ref(module, version, folder), folder, dest):
            problems.append(f"{module}@{version}: {err}")
        gov = go_version(dest) if os.path.isdir(dest) else ""
        lines += [f"# {module} {version}", "## explicit" + (f"; go {gov}" if gov else "")]
        lines += packages(vendor_dir, dest) if os.path.isdir(dest) else []
    with open(os.path.join(vendor_dir, "modules.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    return problems


if __name__ == "__main__":
    problems = vendor(sys.argv[1])
    for problem in problems:
        print(f"  not vendored: {problem}")
    if problems:  # go build names any package it then misses
        print("  (harmless for modules only tests import: testify, go-cmp, go-spew, ...)")
