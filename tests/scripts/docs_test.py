#!/usr/bin/python3
"""The README, docs/ and scripts/ hold what they promise, one named test per invocation:

    docs_test.py NAME --binary PATH [--mpirun EXE] [--root SOURCE_DIR]

    readme_shape        README.md: at most 250 lines, the demo and test commands first, every docs/
                        page linked from it; no date, time of day or load average in README.md or
                        docs/ outside docs/results/; no pointer outside the repository
    readme_examples     the README's mpirun example and Python snippet run as written (in a scratch
                        directory whose build/ is this build); every line of its C++ snippet is a
                        line of examples/attention_example.cpp, which library.install_build_examples_run_n2
                        builds and runs
    no_embedded_python  no shell script in scripts/ feeds Python through a heredoc or -c
    results_tables      scripts/results.py --check: the tables are what docs/results/*.csv give

Exits 0 when every check holds, 1 otherwise (tests/harness.py).
"""
import glob
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness import check, env, main, run  # noqa: E402

ARGS = None  # set by harness.main


def readme():
    with open(os.path.join(ARGS.root, "README.md")) as f:
        return f.read()


def blocks(text):
    """(language, body) of every fenced block, in order."""
    return [(m.group(1), m.group(2)) for m in re.finditer(r"^```(\w*)\n(.*?)^```$", text, re.S | re.M)]


def docs_pages():
    """The markdown pages under docs/: those git tracks in a checkout (a page being written is not
    yet one), every one otherwise."""
    p = subprocess.run(["git", "-C", ARGS.root, "ls-files", "docs"], capture_output=True, text=True)
    if p.returncode == 0 and p.stdout.strip():
        return sorted(f for f in p.stdout.split() if f.endswith(".md"))
    pages = glob.glob(os.path.join(ARGS.root, "docs", "**", "*.md"), recursive=True)
    return sorted(os.path.relpath(p, ARGS.root) for p in pages)


# A date (2026-12-01, 1 December 2026), a time of day (22:00, 14:41 UTC), a load average, or the
# words a lab notebook uses for when.
DATED = re.compile(r"\b20\d\d-\d\d-\d\d\b|\b\d{1,2}:\d\d\b|\bUTC\b|load average|\b(this|that) (evening|morning)\b|"
                   r"\b(January|February|March|April|June|July|August|September|October|November|December) 20\d\d\b",
                   re.I)
# Pointers outside the repository, and issue numbers.
OUTSIDE = re.compile(r"\.\./shared|shared/seeds|DESIGN\.md|\bseeds? ?0\d\d|seed-0\d\d|\bissue #?\d+|\bwalkthrough\b|"
                     r"teaching example", re.I)


def test_readme_shape():
    text = readme()
    lines = text.splitlines()
    check(len(lines) <= 250, f"README.md has {len(lines)} lines (at most 250)")
    head = "\n".join(lines[:6])
    first_cmds = [ln.split("#")[0].strip() for ln in lines[:6] if ln.startswith("bash ")]
    check(first_cmds == ["bash scripts/demo.sh", "bash scripts/test.sh"] and lines[2] == "```sh",
          f"the two commands open the README: {first_cmds} ({head[:120]!r})")
    links = set(re.findall(r"\]\((docs/[^)#]+)", text))
    for page in docs_pages():
        linked = page in links or (page.endswith("README.md") and os.path.dirname(page) + "/" in links)
        check(linked, f"{page} is linked from README.md")
    for link in sorted(links):
        check(os.path.exists(os.path.join(ARGS.root, link)), f"README.md's link {link} exists")
    for path in ["README.md"] + [p for p in docs_pages() if not p.startswith("docs/results/")]:
        with open(os.path.join(ARGS.root, path)) as f:
            body = f.read()
        dated = sorted({m.group(0) for m in DATED.finditer(body)})
        check(not dated, f"{path}: no date, time of day or load average ({dated})")
        if path != "docs/architecture.md":  # another page's owner keeps it
            outside = sorted({m.group(0) for m in OUTSIDE.finditer(body)})
            check(not outside, f"{path}: no pointer outside the repository ({outside})")


def test_readme_examples():
    text = readme()
    bs = blocks(text)
    build = os.path.dirname(os.path.abspath(ARGS.binary))
    with tempfile.TemporaryDirectory() as d:
        os.symlink(build, os.path.join(d, "build"))
        shells = [b for lang, b in bs if lang == "sh" and b.lstrip().startswith("mpirun")]
        check(len(shells) == 1, f"one mpirun example in the README ({len(shells)})")
        for body in shells:
            # the output block follows the command's block
            i = [b for _, b in bs].index(body)
            shown = bs[i + 1][1].splitlines() if i + 1 < len(bs) else []
            p = subprocess.run(["bash", "-c", body], cwd=d, env=env(), capture_output=True, text=True, timeout=300)
            check(p.returncode == 0, f"the README's mpirun example exits 0 ({p.returncode}: {p.stderr.strip()[-300:]})")
            got = p.stdout.splitlines()
            check(len(got) == len(shown), f"it prints as many lines as the README shows ({len(got)} vs {len(shown)})")
            # the header, the table's columns and the labels of the lines below are the README's
            label = lambda ln: re.sub(r"[-+]?\d[\d.e+-]*( ?(ms|MiB|KiB|GiB|B|%))?", "#", ln).split()  # noqa: E731
            for g, s in zip(got, shown):
                check(label(g)[:6] == label(s)[:6], f"line as shown: {s[:70]!r} ~ {g[:70]!r}")
        pys = [b for lang, b in bs if lang == "python"]
        check(len(pys) == 1, f"one Python snippet in the README ({len(pys)})")
        for body in pys:
            with open(os.path.join(d, "example.py"), "w") as f:
                f.write(body)
            p = subprocess.run([ARGS.mpirun, "-np", "2", "/usr/bin/python3", "example.py"], cwd=d, capture_output=True,
                               text=True, timeout=300, env=dict(env(), PYTHONPATH=os.path.join(build, "python")))
            check(p.returncode == 0, f"the README's Python snippet runs under mpirun -np 2 ({p.stderr.strip()[-300:]})")
    example = os.path.join(ARGS.root, "examples", "attention_example.cpp")
    with open(example) as f:
        source = {ln.strip() for ln in f}
    cpps = [b for lang, b in bs if lang == "cpp"]
    check(len(cpps) == 1, f"one C++ snippet in the README ({len(cpps)})")
    for body in cpps:
        for ln in body.splitlines():
            if ln.strip().startswith("// ..."):
                continue  # an elision
            check(ln.strip() in source, f"C++ line from examples/attention_example.cpp: {ln.strip()!r}")


def test_no_embedded_python():
    for path in sorted(glob.glob(os.path.join(ARGS.root, "scripts", "*.sh"))):
        with open(path) as f:
            text = f.read()
        bad = re.findall(r"python3?\s+-\s.*<<|python3?\s+-c\b", text)
        check(not bad, f"{os.path.relpath(path, ARGS.root)}: no Python in the shell script ({bad[:2]})")


def test_results_tables():
    p = run(["/usr/bin/python3", os.path.join(ARGS.root, "scripts", "results.py"), "--check"])
    check(p.returncode == 0, f"scripts/results.py --check: the committed tables are the CSVs' "
                             f"({p.returncode}: {p.stderr.strip()[-400:]})")


if __name__ == "__main__":
    sys.exit(main(globals(), lambda ap: ap.add_argument(
        "--root", default=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))))
