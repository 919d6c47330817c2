#!/usr/bin/env python3
"""Runs the examples of README.md and docs/*.md as written, the way Rust's
doc tests keep its documentation honest.

Each page is read top to bottom as a user would follow it in one terminal
session, in the repository root, with `target/release` and `.venv/bin` on
PATH. Fenced blocks run by their language:

- `sh`: every line through bash, in order, in one shell per block
  (`set -e`: a failing line fails the page). A line whose comment says
  `# prints: TEXT` must print exactly TEXT (its first line of output); one
  whose comment says `# exits N` must exit with status N.
  A `fabrickv serve ...` line (or `make run`) is a server the page runs in
  the foreground: the checker starts it in the background, stops the
  page's previous foreground server first (the user's Ctrl-C), and goes on
  once the server printed its banner. A line ending in `&` starts a
  background process that lives until the page ends; the checker goes on
  once it listens (a TCP or unix socket) or prints the banner. `make test` is the run doing the check and is not run
  again.
- `python`: the block through `.venv/bin/python`.
- `rust`: the block as the body of `fn main() -> Result<(), Box<dyn Error>>`
  in a binary that depends on `fabrickv-client`, built once for all pages
  and run at the block's place.
- `toml`: parsed; after `<!-- doc-check: file NAME -->` also written to NAME
  (removed when the page ends) for the commands that follow.
- anything else (`text`, output samples, no language): not run.

`<!-- doc-check: skip WHY -->` before a block leaves it out, and the
checker prints each skip with its reason. Servers listen on loopback only:
a page that names any other address fails the check before it runs.
Files the examples create in the repository are removed afterwards.

Usage: scripts/doc-check.py [PAGE ...] (default: README.md docs/*.md)
"""

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# A server is ready within this many seconds, even on a loaded machine.
READY_DEADLINE_S = 120
# One example line or block finishes within this many seconds.
STEP_DEADLINE_S = 300
# The banner `fabrickv serve` prints once every listener is up.
BANNER = "(Ctrl-C to stop)"
FENCE_RE = re.compile(r"^```(\w*)\s*$")
MARK_RE = re.compile(r"^<!--\s*doc-check:\s*(\w+)\s*(.*?)\s*-->\s*$")
PRINTS_RE = re.compile(r"#\s*prints:\s*(.*?)\s*$")
EXITS_RE = re.compile(r"#\s*exits\s+(\d+)\s*$")
# IPv4 and bracketed IPv6 literals; only loopback ones may appear in a run.
# An IPv6 literal always holds a colon, so an index such as `keys[0]` is
# not one.
ADDR_RE = re.compile(r"\b(\d{1,3}(?:\.\d{1,3}){3})\b|\[([0-9a-fA-F]*:[0-9a-fA-F:]*)\]")


class Failure(Exception):
    pass


def blocks(path):
    """(line number, language, text, mark) of each fenced block of a page."""
    out, mark, lang, start, body = [], None, None, 0, []
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    for n, line in enumerate(lines, 1):
        if lang is None:
            m = MARK_RE.match(line)
            if m:
                mark = (m.group(1), m.group(2))
                continue
            m = FENCE_RE.match(line)
            if m:
                lang, start, body = m.group(1), n, []
            elif line.strip():
                # A mark applies to the block right after it (blank lines apart).
                mark = None
            continue
        if line.startswith("```"):
            out.append((start, lang, "\n".join(body), mark))
            lang, mark = None, None
        else:
            body.append(line)
    return out


def check_addresses(page, text, lineno):
    for m in ADDR_RE.finditer(text):
        v4, v6 = m.group(1), m.group(2)
        if v4 and not v4.startswith("127."):
            raise Failure(f"{page}:{lineno}: {v4} is not loopback; examples that run use loopback")
        if v6 and v6 not in ("::1",):
            raise Failure(f"{page}:{lineno}: [{v6}] is not loopback")


class Session:
    """One page's terminal: its servers, its files, its environment."""

    def __init__(self, page, rust_bins):
        self.page = page
        self.rust_bins = rust_bins
        self.foreground = None
        self.background = []
        self.files = []
        self.logs = tempfile.mkdtemp(prefix="fkv-doc-")
        self.env = dict(os.environ)
        self.env["PATH"] = os.pathsep.join(
            [os.path.join(ROOT, "target", "release"), os.path.join(ROOT, ".venv", "bin"),
             os.path.join(ROOT, ".tools", "bin"), self.env["PATH"]]
        )
        self.env.pop("FABRICKV_SERVER", None)
        # The page's `export`/`unset` lines, replayed in every later shell.
        self.exports = []
        self.count = 0

    def log(self, name):
        self.count += 1
        return os.path.join(self.logs, f"{self.count:03}-{name}.log")

    def start(self, cmd, lineno, banner):
        log = self.log("server")
        with open(log, "w") as out:
            p = subprocess.Popen(
                ["bash", "-c", self.exported(cmd)], cwd=ROOT, env=self.env, stdout=out,
                stderr=subprocess.STDOUT, start_new_session=True,
            )
        deadline = time.monotonic() + READY_DEADLINE_S
        while time.monotonic() < deadline:
            if p.poll() is not None:
                raise Failure(f"{self.page}:{lineno}: `{cmd}` exited with {p.returncode}:\n{read(log)}")
            if BANNER in read(log):
                return p
            if not banner and listening(p.pid):
                return p
            time.sleep(0.1)
        stop(p)
        raise Failure(f"{self.page}:{lineno}: `{cmd}` was not ready in {READY_DEADLINE_S} s:\n{read(log)}")

    def serve(self, cmd, lineno):
        if self.foreground is not None:
            stop(self.foreground)
        self.foreground = self.start(cmd, lineno, banner=True)

    def shell(self, text, lineno):
        """Runs a sh block line by line in one bash, servers apart."""
        # The lines gathered for the next shell, and the page's exports as
        # they stood when it began (an `unset` later in the block must not
        # run before the lines that still need the variable).
        pending, since = [], list(self.exports)
        for n, line in logical_lines(text, lineno + 1):
            code = line.split(" #")[0].rstrip() if not line.lstrip().startswith("#") else ""
            if not code.strip():
                continue
            check_addresses(self.page, code, n)
            if re.match(r"^make (test|test-stressed)\b", code):
                # The run doing this check is `make test`; it does not recurse.
                print(f"  {os.path.relpath(self.page, ROOT)}:{n}: `{code}` is this run itself")
                continue
            background = code.endswith("&")
            if background or re.match(r"^(fabrickv serve\b|make run\b)", code):
                self.flush(pending, since, n)
                pending, since = [], list(self.exports)
                if background:
                    cmd = code[:-1].strip()
                    self.background.append(self.start(cmd, n, cmd.startswith("fabrickv serve")))
                else:
                    self.serve(code, n)
                continue
            m = PRINTS_RE.search(line)
            e = EXITS_RE.search(line)
            if e:
                want = int(e.group(1))
                pending.append(
                    f"if {code}; then __rc=0; else __rc=$?; fi; if [ $__rc -ne {want} ]; then "
                    f"echo \"line {n}: exited $__rc, the page says {want}\" >&2; exit 1; fi"
                )
            elif m:
                want = m.group(1)
                pending.append(
                    f"__got=$({code} | head -n 1); if [ \"$__got\" != {shlex.quote(want)} ]; then "
                    f"echo \"line {n}: printed $(printf %q \"$__got\"), the page says {shlex.quote(want)}\" >&2; exit 1; fi"
                )
            else:
                pending.append(code)
            if re.match(r"^(export|unset)\b", code):
                self.exports.append(code)
        self.flush(pending, since, lineno)

    def exported(self, cmd):
        """`cmd` after the page's exports, as a shell that ran them would;
        exec'd, so that the process waited on and stopped is the command
        itself, not a shell around it."""
        return "; ".join(self.exports + ["exec " + cmd])

    def flush(self, pending, exports, lineno):
        """Runs the gathered lines, if any, after `exports`, in one bash."""
        if not pending:
            return
        script = ["set -eo pipefail", "cd " + shlex.quote(ROOT), *exports, *pending]
        self.run(["bash", "-c", "\n".join(script)], lineno, "sh")

    def run(self, argv, lineno, what):
        log = self.log(what)
        with open(log, "w") as out:
            try:
                r = subprocess.run(argv, cwd=ROOT, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                   timeout=STEP_DEADLINE_S)
            except subprocess.TimeoutExpired:
                raise Failure(f"{self.page}:{lineno}: {what} block ran past {STEP_DEADLINE_S} s:\n{read(log)}")
        if r.returncode != 0:
            raise Failure(f"{self.page}:{lineno}: {what} block failed ({r.returncode}):\n{read(log)}")

    def python(self, text, lineno):
        check_addresses(self.page, text, lineno)
        py = os.path.join(ROOT, ".venv", "bin", "python")
        self.run([py, "-c", text], lineno, "python")

    def rust(self, lineno):
        self.run([self.rust_bins[(self.page, lineno)]], lineno, "rust")

    def toml(self, text, lineno, mark):
        try:
            tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise Failure(f"{self.page}:{lineno}: TOML does not parse: {e}")
        if mark and mark[0] == "file":
            path = os.path.join(ROOT, mark[1])
            if os.path.exists(path):
                raise Failure(f"{self.page}:{lineno}: {mark[1]} exists already; the page would overwrite it")
            with open(path, "w") as f:
                f.write(text + "\n")
            self.files.append(path)

    def close(self):
        for p in [self.foreground, *self.background]:
            if p is not None:
                stop(p)
        for f in self.files:
            if os.path.exists(f):
                os.remove(f)
        shutil.rmtree(self.logs, ignore_errors=True)


def logical_lines(text, first):
    """(line number, line) of a shell text, `\\`-continued lines joined."""
    out, held, at = [], "", first
    for i, line in enumerate(text.split("\n")):
        if not held:
            at = first + i
        if line.endswith("\\"):
            held += line[:-1] + " "
            continue
        out.append((at, held + line))
        held = ""
    if held:
        out.append((at, held))
    return out


def read(path):
    with open(path, errors="replace") as f:
        return f.read()[-4000:]


def stop(p):
    if p.poll() is None:
        try:
            os.killpg(p.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def listening(pid):
    """Whether process `pid` has a listening TCP or unix socket."""
    try:
        out = subprocess.run(["ss", "-Hltnxp"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return False
    return f"pid={pid}," in out


def build_rust(pages):
    """Builds every rust block of `pages` into one binary each; returns
    {(page, line): path}."""
    found = [(p, n, text) for p in pages for (n, lang, text, mark) in blocks(p)
             if lang == "rust" and not (mark and mark[0] == "skip")]
    if not found:
        return {}
    crate = os.path.join(ROOT, "target", "doc-examples")
    shutil.rmtree(os.path.join(crate, "src"), ignore_errors=True)
    os.makedirs(os.path.join(crate, "src", "bin"))
    client = os.path.join(ROOT, "crates", "client")
    with open(os.path.join(crate, "Cargo.toml"), "w") as f:
        f.write(
            '[package]\nname = "fabrickv-doc-examples"\nversion = "0.0.0"\nedition = "2021"\npublish = false\n\n'
            f'[dependencies]\nfabrickv-client = {{ path = "{client}" }}\n\n[workspace]\n'
        )
    # The workspace's lock file, so the examples build against the same
    # dependency versions as the binary (and reuse its compiled crates).
    shutil.copy(os.path.join(ROOT, "Cargo.lock"), os.path.join(crate, "Cargo.lock"))
    bins = {}
    for i, (page, n, text) in enumerate(found):
        name = f"block{i}"
        with open(os.path.join(crate, "src", "bin", name + ".rs"), "w") as f:
            f.write(f"// {os.path.relpath(page, ROOT)}:{n}\n#[allow(unused_variables)]\n"
                    "fn main() -> Result<(), Box<dyn std::error::Error>> {\n" + text + "\n    Ok(())\n}\n")
        bins[(page, n)] = os.path.join(ROOT, "target", "release", name)
    env = dict(os.environ, CARGO_TARGET_DIR=os.path.join(ROOT, "target"))
    r = subprocess.run(["cargo", "build", "--release", "--quiet", "--manifest-path",
                        os.path.join(crate, "Cargo.toml"), "--bins"], env=env)
    if r.returncode != 0:
        raise Failure("the rust examples do not compile (see above)")
    return bins


def check_page(page, rust_bins):
    s = Session(page, rust_bins)
    rel = os.path.relpath(page, ROOT)
    ran = skipped = 0
    try:
        for lineno, lang, text, mark in blocks(page):
            if mark and mark[0] == "skip":
                print(f"  {rel}:{lineno}: skipped ({mark[1]})")
                skipped += 1
                continue
            if lang == "sh":
                s.shell(text, lineno)
            elif lang == "python":
                s.python(text, lineno)
            elif lang == "rust":
                s.rust(lineno)
            elif lang == "toml":
                s.toml(text, lineno, mark)
            else:
                continue
            ran += 1
    finally:
        s.close()
    print(f"{rel}: {ran} examples ran, {skipped} skipped")


def untracked():
    out = subprocess.run(["git", "ls-files", "--others", "--exclude-standard"], cwd=ROOT,
                         capture_output=True, text=True).stdout
    return set(out.split())


def main():
    pages = [os.path.abspath(p) for p in sys.argv[1:]] or [os.path.join(ROOT, "README.md")] + sorted(
        os.path.join(ROOT, "docs", f) for f in os.listdir(os.path.join(ROOT, "docs")) if f.endswith(".md"))
    before = untracked()
    try:
        rust_bins = build_rust(pages)
        for page in pages:
            check_page(page, rust_bins)
    except Failure as e:
        print(f"doc-check: FAILED: {e}", file=sys.stderr)
        return 1
    finally:
        for f in untracked() - before:
            os.remove(os.path.join(ROOT, f))
    print("doc-check: every example ran as written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
