"""The documentation in the repository is held against the code (issue 36).

- README.md is the user's page: at most 300 lines; the rest lives in docs/.
- Every relative link in README.md and docs/*.md resolves: the file exists and, for a link with
  a fragment, the target markdown has a heading with that anchor (GitHub's slugs).
- docs/recipes.md, docs/design.md, docs/adding-a-device.md and README.md name real things: every path in backquotes exists,
  every "`name` in `path`" is found in that file, every other name in backquotes is found in the
  sources. A rename in the code breaks this test until the docs follow it. The other docs pages:
  every path they name exists.
- Nothing cites a design document outside the repository.
Read from the files: no build needed."""
import glob
import os
import re
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(ROOT, "docs")
README = os.path.join(ROOT, "README.md")
HELD = ("recipes.md", "design.md", "adding-a-device.md")          # the pages whose every name is checked
TOP_DIRS = ("csrc/", "cuda/", "ortmod/", "python/", "tests/", "scripts/", "bench/", "docs/", "demo/")
BUILD_OUTPUTS = {"ortmod/bin/ortmod-train", "ortmod/libortmod_cuda.so"}   # made by make build, ignored by git
SOURCE_EXTS = (".py", ".c", ".h", ".cu", ".cuh", ".cmake", ".mk", ".cpp", ".sh")
IDENT = re.compile(r"^\.?([A-Za-z_][A-Za-z0-9_]*)(\(\))?$")
PATHLIKE = re.compile(r"^[\w.\-/]+$")
PAIR = re.compile(r"`([^`\n]+)` in `([^`\n]+)`")


def markdown_files():
    return [README] + sorted(glob.glob(os.path.join(DOCS, "*.md")))


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def without_code_blocks(text):
    return re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)


def slug(heading):
    """GitHub's anchor for a heading's text."""
    s = heading.strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def anchors(path):
    seen, out = {}, set()
    for line in without_code_blocks(read(path)).splitlines():
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        base = slug(m.group(1))
        n = seen.get(base, 0)
        out.add(base if n == 0 else f"{base}-{n}")
        seen[base] = n + 1
    return out


def broken_links(path):
    problems = []
    text = without_code_blocks(read(path))
    text = re.sub(r"`[^`\n]*`", "", text)           # a link written inside code is not a link
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"^[a-z]+:", target):              # http:, https:, mailto:
            continue
        file_part, _, fragment = target.partition("#")
        dest = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
        if not os.path.exists(dest):
            problems.append(f"{os.path.relpath(path, ROOT)}: link to missing {target}")
        elif fragment and dest.endswith(".md") and fragment not in anchors(dest):
            problems.append(f"{os.path.relpath(path, ROOT)}: no heading for #{fragment} in {os.path.relpath(dest, ROOT)}")
    return problems


_sources = None


def source_text():
    """Every source file's text, once: where a name from the docs must appear."""
    global _sources
    if _sources is None:
        texts = []
        for top in ("csrc", "cuda", "ortmod", "python", "tests", "scripts", "bench"):
            for d, _, files in os.walk(os.path.join(ROOT, top)):
                if os.path.relpath(d, ROOT).startswith(os.path.join("csrc", "graph", "gen")):
                    continue
                texts += [read(os.path.join(d, f)) for f in files
                          if f.endswith(SOURCE_EXTS) and f != "test_docs.py"]   # not the names quoted here
        texts += [read(os.path.join(ROOT, f)) for f in ("CMakeLists.txt", "Makefile")]
        _sources = "\n".join(texts)
    return _sources


_source_words = None


def in_sources(name):
    """found(name, source_text()), with the sources' words as a set (one pass, not one search a name)."""
    global _source_words
    if not IDENT.match(name):
        return name in source_text()
    if _source_words is None:
        _source_words = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", source_text()))
    return IDENT.match(name).group(1) in _source_words


def found(name, text):
    if IDENT.match(name):
        return re.search(r"(?<![A-Za-z0-9_])" + re.escape(IDENT.match(name).group(1)) + r"(?![A-Za-z0-9_])",
                         text) is not None
    return name in text


_tracked = None


def tracked_files():
    global _tracked
    if _tracked is None:
        _tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                                  check=True).stdout.split()
    return _tracked


def tracked_basenames():
    return {os.path.basename(f) for f in tracked_files()}


def path_exists(p):
    p = p.rstrip("/")
    return p in BUILD_OUTPUTS or os.path.exists(os.path.join(ROOT, p))


def unheld_names(text, names=True):
    """What a page names in backquotes that the code does not have (names=False: its paths only)."""
    problems = []
    for name, where in PAIR.findall(text) if names else ():
        if "<" in name or "<" in where or not PATHLIKE.match(where) or "/" not in where:
            continue
        if not path_exists(where):
            problems.append(f"`{where}` does not exist")
        elif os.path.isfile(os.path.join(ROOT, where)) and not found(name.strip('"'), read(os.path.join(ROOT, where))):
            problems.append(f"`{name}` is not in {where}")
    for span in re.findall(r"`([^`\n]+)`", text):
        if "<" in span:
            continue
        if PATHLIKE.match(span) and "/" in span:
            if span.startswith(TOP_DIRS) and not path_exists(span):
                problems.append(f"`{span}` does not exist")
        elif " " in span:                                  # a command or a line of code: its paths
            for tok in span.split():
                tok = tok.strip("(),;:'\"")
                if PATHLIKE.match(tok) and tok.startswith(TOP_DIRS) and "*" not in tok and not path_exists(tok):
                    problems.append(f"`{tok}` (in `{span}`) does not exist")
        elif re.match(r"^[\w\-]+\.(py|c|h|cu|cuh|md|sh)$", span):   # a file named without its directory
            if span not in tracked_basenames():
                problems.append(f"no file named `{span}`")
        elif names and IDENT.match(span) and not in_sources(span):
            problems.append(f"`{span}` is not in the sources")
    return problems


def test_readme_is_the_users_page():
    n = len(read(README).splitlines())
    assert n <= 300, f"README.md has {n} lines (at most 300: the rest goes to docs/)"


def test_the_status_table_has_one_line_cells():
    """The README's status table says a feature's state in a line; docs/status.md has the rest."""
    text = read(README)
    section = text[text.index("\n## Status"):]
    section = section[:section.index("\n## ", 1)]
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| feature")]
    assert len(rows) >= 10, "the status table went missing"
    long = [cell for row in rows for cell in row.strip("|").split(" | ") if len(cell.strip()) > 200]
    assert long == [], f"status cells over 200 characters (move the detail to docs/status.md): {long}"


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: os.path.relpath(p, ROOT))
def test_relative_links_resolve(path):
    assert broken_links(path) == []


@pytest.mark.parametrize("page", HELD)
def test_every_name_a_page_gives_is_in_the_code(page):
    assert unheld_names(read(os.path.join(DOCS, page))) == []


def test_every_name_the_readme_gives_is_in_the_code():
    assert unheld_names(read(README)) == []


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: os.path.relpath(p, ROOT))
def test_every_path_a_page_names_exists(path):
    """The other pages also name torch's, numpy's or ONNX Runtime's functions, which are not ours
    to find: for them only the repository's paths are held."""
    assert unheld_names(read(path), names=False) == []


def test_each_recipe_has_its_files():
    text = read(os.path.join(DOCS, "recipes.md"))
    sections = dict(re.findall(r"^## \((\w)\) (.*)$", text, re.M))
    assert sorted(sections) == ["a", "b", "c", "d"], sections
    must = {"a": ["csrc/ops/op_list.h", "csrc/ops/elementwise.c", "tests/test_ops_elementwise.py"],
            "b": ["csrc/passes/pass.c", "csrc/passes/pass.h", "tests/test_passes.py"],
            "c": ["ortmod/capture/torchscript_registry.py", "ortmod/capture/export_registry.py",
                  "ortmod/capture/audit.py", "tests/test_semantics.py", "tests/test_capture_export.py"],
            "d": ["cuda/common.cuh", "csrc/ops/op_list.h", "tests/gpu/test_ops_cuda.py"]}
    parts = re.split(r"^## \(\w\) .*$", text, flags=re.M)[1:]
    for key, part in zip(sorted(sections), parts):
        for path in must[key]:
            assert f"`{path}`" in part, f"recipe ({key}) does not name {path}"


def test_the_checks_catch_a_rename():
    """The checker itself: a renamed symbol, a moved file and a dead link are each reported."""
    assert unheld_names("`sign_grad` in `csrc/ops/elementwise.c`") == []
    assert unheld_names("`sign_gradient` in `csrc/ops/elementwise.c`") != []
    assert unheld_names("`csrc/ops/elementwise_ops.c`") != []
    assert unheld_names("`om_emit_twice`") != []
    assert unheld_names("run `python scripts/opz.py --check`") != []
    assert slug("Capture paths: TorchScript and torch.export") == "capture-paths-torchscript-and-torchexport"


def test_no_file_cites_a_design_document_outside_the_repository():
    citing = []
    for rel in tracked_files():
        if rel == "tests/test_docs.py" or not rel.endswith(SOURCE_EXTS + (".md", ".txt", ".toml")):
            continue
        text = read(os.path.join(ROOT, rel)) if os.path.isfile(os.path.join(ROOT, rel)) else ""
        if "DESIGN.md" in text or "/work/shared" in text:
            citing.append(rel)
    assert citing == [], f"cite docs/design.md instead: {citing}"
