"""Every Python block and shell command of README.md and docs/*.md runs here, so the documentation
cannot drift from the code (issue 25).

What is collected:

- each fenced ```python block; the blocks of one document run in order in one namespace, so a
  block may use the names an earlier block of its document defined;
- each command of a ```sh / ```bash / ```shell block, of a ```console block (lines starting
  with `$ `), and of an indented (4-space) block whose first word is a command (`tcstage`,
  `python3`, ...), as the README and docs/tuning.md write them. Lines are joined as a shell
  joins them (a trailing backslash, or a quote still open), and `a && b` is two commands.

Everything runs in a temporary working directory per document and worker process, holding
links to the repository's `examples/` and `benchmarks/` and a copy of `schedules/` (so that
`--save schedules/mine.txt` and `--plot out.png` write there), with the repository root
importable and a tuning cache of the document's own. `tcstage ...` commands run in this process through `tcstage.cli.main`, which is
what the installed `tcstage` script calls; other commands run as subprocesses.

A `tc.TCWarning` from a Python block, or a `warning:` line from a command, is a failure, unless
the block is marked as one that demonstrates a warning. Markers are HTML comments on the lines
right before a block (invisible when the Markdown is rendered):

    <!-- docs-test: slow -->     runs in the slow step (pytest -m slow), not the README's command
    <!-- docs-test: gpu -->      needs a GPU (pytest.mark.gpu; skipped, with the reason, elsewhere)
    <!-- docs-test: warns -->    must warn (a block that shows a warning)
    <!-- docs-test: skip: REASON -->               not run, for a reason the report shows
    <!-- docs-test: skip "PREFIX": REASON -->      only the block's commands starting with PREFIX

A slow, GPU or skipped Python block runs in a copy of its document's namespace, so the blocks
after it do not depend on whether it ran: they see the names of the earlier blocks that always
run.
"""

import os
import re
import shlex
import shutil
import subprocess
import sys
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tcstage import cli
from tcstage.errors import TCWarning

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

SHELL_LANGUAGES = {"sh", "bash", "shell", "console"}
COMMAND_WORDS = {"tcstage", "python3", "python", "bash", "pip", "pytest"}
MARKER = re.compile(r"<!--\s*docs-test:\s*(.*?)\s*-->")
SKIP = re.compile(r'skip(?:\s+"([^"]+)")?\s*:\s*(\S.*)')


@dataclass(frozen=True)
class Marks:
    slow: bool = False
    gpu: bool = False
    warns: bool = False
    skips: tuple[tuple[str | None, str], ...] = ()  # (command prefix or None: all, reason)

    def skip_reason(self, command: str | None) -> str | None:
        for prefix, reason in self.skips:
            if prefix is None or (command is not None and command.startswith(prefix)):
                return reason
        return None


@dataclass(frozen=True)
class Block:
    doc: str  # relative to the repository root
    line: int  # of the block's first line of code (1-based)
    kind: str  # "python" or "shell"
    text: str
    marks: Marks
    commands: tuple[tuple[int, str], ...] = ()  # (line, command text) of a shell block

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.line}"


@dataclass
class Document:
    path: Path
    blocks: list[Block] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # misplaced or unknown markers


def parse_marks(texts: list[str], where: str, problems: list[str]) -> Marks:
    slow = gpu = warns = False
    skips = []
    for text in texts:
        if text == "slow":
            slow = True
        elif text == "gpu":
            gpu = True
        elif text == "warns":
            warns = True
        elif m := SKIP.fullmatch(text):
            skips.append((m.group(1), m.group(2)))
        else:
            problems.append(f"{where}: unknown marker 'docs-test: {text}'")
    return Marks(slow, gpu, warns, tuple(skips))


def shell_commands(lines: list[str], first: int, console: bool) -> tuple[list[tuple[int, str]],
                                                                          list[str]]:
    """The commands of a shell block as a shell reads them: (line, text) each, and problems."""
    commands, problems = [], []
    text, start = "", first
    for k, line in enumerate(lines):
        if not text:
            if console:
                if not line.startswith("$ "):
                    continue  # a command's output
                line = line[2:]
            if not line.strip() or line.strip().startswith("#"):
                continue
            text, start = line.strip(), first + k
        else:
            text += "\n" + line
        if text.endswith("\\"):  # a backslash-newline disappears, as in a shell
            text = text[:-1]
            continue
        try:
            shlex.split(text, comments=True)
        except ValueError:  # a quote still open: the shell reads on
            continue
        parts = [p.strip() for p in split_and(text)]
        for p in parts:
            if re.search(r"(?<![\w\"'])[|;<>]|\$\(|`", strip_quoted(p)):
                problems.append(f"line {start}: '{p}' uses shell syntax this test does not run "
                                "(only commands joined by &&)")
        commands += [(start, p) for p in parts]
        text = ""
    if text:
        problems.append(f"line {start}: the command '{text}' does not end")
    return commands, problems


def strip_quoted(text: str) -> str:
    return re.sub(r"'[^']*'|\"[^\"]*\"", "''", text)


def split_and(text: str) -> list[str]:
    """`a && b` as the two commands a shell runs one after the other (not inside quotes)."""
    parts, quote, current, k = [], None, "", 0
    while k < len(text):
        c = text[k]
        if quote:
            quote = None if c == quote else quote
        elif c in "'\"":
            quote = c
        elif text.startswith("&&", k):
            parts.append(current)
            current, k = "", k + 2
            continue
        current += c
        k += 1
    return [*parts, current]


def parse(path: Path) -> Document:
    doc = Document(path)
    name = str(path.relative_to(ROOT))
    lines = path.read_text().splitlines()
    pending: list[str] = []
    pending_line = 0
    k = 0

    def take_marks(where: str) -> Marks:
        nonlocal pending
        marks = parse_marks(pending, where, doc.problems)
        pending = []
        return marks

    while k < len(lines):
        line = lines[k]
        if m := MARKER.fullmatch(line.strip()):
            if not pending:
                pending_line = k + 1
            pending.append(m.group(1))
            k += 1
            continue
        fence = re.fullmatch(r"(\s*)```\s*([\w+-]*)\s*", line)
        if fence:
            end = next((j for j in range(k + 1, len(lines)) if lines[j].strip() == "```"), None)
            if end is None:
                doc.problems.append(f"{name}:{k + 1}: a code fence that is never closed")
                break
            language, body = fence.group(2).lower(), lines[k + 1:end]
            indent = len(fence.group(1))
            body = [b[indent:] if b[:indent].isspace() else b for b in body]
            where = f"{name}:{k + 2}"
            if language == "python":
                doc.blocks.append(Block(name, k + 2, "python", "\n".join(body) + "\n",
                                        take_marks(where)))
            elif language in SHELL_LANGUAGES:
                marks = take_marks(where)
                commands, problems = shell_commands(body, k + 2, language == "console")
                doc.problems += [f"{name}:{p}" for p in problems]
                doc.blocks.append(Block(name, k + 2, "shell", "\n".join(body), marks,
                                        tuple(commands)))
            elif pending:
                doc.problems.append(f"{name}:{pending_line}: a docs-test marker before a "
                                    f"```{language} block, which is not run")
                pending = []
            k = end + 1
            continue
        previous = lines[k - 1].strip() if k else ""
        if line.startswith("    ") and line.strip() and (not previous or MARKER.fullmatch(previous)):
            end = k
            while end < len(lines) and (lines[end].startswith("    ") or not lines[end].strip()):
                end += 1
            while not lines[end - 1].strip():
                end -= 1
            body = [b[4:] for b in lines[k:end]]
            if body[0].split()[0] in COMMAND_WORDS:
                where = f"{name}:{k + 1}"
                marks = take_marks(where)
                commands, problems = shell_commands(body, k + 1, console=False)
                doc.problems += [f"{name}:{p}" for p in problems]
                doc.blocks.append(Block(name, k + 1, "shell", "\n".join(body), marks,
                                        tuple(commands)))
            elif pending:
                doc.problems.append(f"{name}:{pending_line}: a docs-test marker before an "
                                    "indented block that is no command")
                pending = []
            k = end
            continue
        if line.strip() and pending:
            doc.problems.append(f"{name}:{pending_line}: a docs-test marker that is not right "
                                "before a code block")
            pending = []
        k += 1
    for block in doc.blocks:
        for prefix, _ in block.marks.skips:
            if prefix is not None and not any(c.startswith(prefix) for _, c in block.commands):
                doc.problems.append(f"{block.where}: skip \"{prefix}\" matches no command of "
                                    "the block")
    return doc


DOCUMENTS = {str(p.relative_to(ROOT)): parse(p) for p in DOCS}


# -- the items ---------------------------------------------------------------------------------

def _marks(marks: Marks, skip_reason: str | None) -> list:
    out = []
    if marks.slow:
        out.append(pytest.mark.slow)
    if marks.gpu:
        out.append(pytest.mark.gpu)
    if skip_reason:
        out.append(pytest.mark.skip(reason=skip_reason))
    return out


def _python_params():
    for doc in DOCUMENTS.values():
        for index, block in enumerate(b for b in doc.blocks if b.kind == "python"):
            yield pytest.param(block.doc, index, id=block.where,
                               marks=_marks(block.marks, block.marks.skip_reason(None)))


def _command_params():
    for doc in DOCUMENTS.values():
        for block in doc.blocks:
            if block.kind != "shell":
                continue
            seen: dict[int, int] = {}
            for line, command in block.commands:
                seen[line] = seen.get(line, 0) + 1
                where = f"{block.doc}:{line}" + (f"#{seen[line]}" if seen[line] > 1 else "")
                yield pytest.param(block, command, id=where,
                                   marks=_marks(block.marks, block.marks.skip_reason(command)))


def python_blocks(doc: str) -> list[Block]:
    return [b for b in DOCUMENTS[doc].blocks if b.kind == "python"]


def always_runs(block: Block) -> bool:
    return not (block.marks.slow or block.marks.gpu or block.marks.skip_reason(None))


# -- where they run ----------------------------------------------------------------------------

_WORKDIRS: dict[str, Path] = {}


@pytest.fixture
def workdir(doc_name, tmp_path_factory, monkeypatch) -> Path:
    """The document's working directory (one per document and process), made current."""
    path = _WORKDIRS.get(doc_name)
    if path is None:
        path = tmp_path_factory.mktemp("docs-" + re.sub(r"\W", "-", doc_name))
        for name in ("examples", "benchmarks"):
            (path / name).symlink_to(ROOT / name, target_is_directory=True)
        shutil.copytree(ROOT / "schedules", path / "schedules")
        _WORKDIRS[doc_name] = path
    monkeypatch.chdir(path)
    monkeypatch.syspath_prepend(str(ROOT))
    # one tuning cache per document, as one user's: `tcstage compare` after `tcstage tune`
    # finds the tuned options (conftest gives every other test a cache of its own)
    monkeypatch.setenv("TCSTAGE_CACHE_DIR", str(path / "tuning-cache"))
    return path


@pytest.fixture
def doc_name(request) -> str:
    return request.node.callspec.params.get("doc") or request.node.callspec.params["block"].doc


# -- Python blocks -----------------------------------------------------------------------------

# doc -> (the namespace of its blocks that always run, how many of its blocks have run in it)
_NAMESPACES: dict[str, tuple[dict, int]] = {}


def _execute(block: Block, namespace: dict) -> list[warnings.WarningMessage]:
    """Runs the block in namespace; returns the TCWarnings it issued."""
    # (padded so that a traceback names the document's own line numbers)
    code = compile("\n" * (block.line - 1) + block.text, block.doc, "exec")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        exec(code, namespace)  # noqa: S102 (the documentation's own code)
    return [w for w in caught if issubclass(w.category, TCWarning)]


def _namespace(doc: str, index: int) -> dict:
    """The namespace block `index` of doc runs in: every earlier block that always runs has run
    in it (in this process), in order."""
    namespace, done = _NAMESPACES.get(doc, (None, 0))
    if namespace is None:
        namespace = {"__name__": "__main__"}
    blocks = python_blocks(doc)
    for k in range(done, index):
        if always_runs(blocks[k]):
            try:
                _execute(blocks[k], namespace)
            except BaseException as e:  # noqa: BLE001
                _NAMESPACES[doc] = (namespace, k)
                pytest.fail(f"the earlier block {blocks[k].where}, which this one follows, "
                            f"failed: {type(e).__name__}: {e}", pytrace=False)
    _NAMESPACES[doc] = (namespace, max(done, index))
    return namespace


@pytest.mark.parametrize("doc, index", _python_params())
def test_python_block(doc, index, workdir):
    block = python_blocks(doc)[index]
    if block.marks.gpu:
        from real_gpu import gpu_problem  # tests/
        problem = gpu_problem()
        if problem:
            pytest.skip(f"needs a GPU: {problem}")
    namespace = _namespace(doc, index)
    if not always_runs(block):
        namespace = dict(namespace)  # what it defines stays out of the blocks after it
    try:
        warned = _execute(block, namespace)
    except Exception:
        lines = traceback.format_exc().splitlines()
        pytest.fail(f"{block.where} raised:\n" + "\n".join(lines[-12:]), pytrace=False)
    if always_runs(block):  # (one that raised runs again before the next, which then says so)
        _NAMESPACES[doc] = (_NAMESPACES[doc][0], index + 1)
    _check_warnings(block, [str(w.message) for w in warned])


def _check_warnings(block: Block, messages: list[str]) -> None:
    if block.marks.warns:
        assert messages, f"{block.where} is marked 'warns' but warned nothing"
    else:
        assert not messages, (f"{block.where} warns (mark it <!-- docs-test: warns --> only if "
                              "it shows a warning on purpose):\n" + "\n".join(messages))


# -- commands ----------------------------------------------------------------------------------

@pytest.mark.parametrize("block, command", _command_params())
def test_command(block, command, workdir, capsys):
    argv = shlex.split(command, comments=True)
    if block.marks.gpu:
        from real_gpu import gpu_problem  # tests/
        problem = gpu_problem()
        if problem:
            pytest.skip(f"needs a GPU: {problem}")
    if argv[0] == "tcstage":
        with warnings.catch_warnings():  # main() prints each warning as `warning: ...`
            warnings.simplefilter("always")
            try:
                status = cli.main(argv[1:])
            except SystemExit as e:  # argparse's --version and --help exit
                status = e.code
        out, err = capsys.readouterr()
    else:
        if argv[0] in ("python", "python3", "pip", "pytest"):
            argv = [sys.executable, *(["-m", argv[0]] if argv[0] in ("pip", "pytest") else []),
                    *argv[1:]]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=600,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
        status, out, err = done.returncode, done.stdout, done.stderr
    assert status == 0, f"{block.where}: '{command}' exited with {status}:\n{err}\n{out[-3000:]}"
    _check_warnings(block, [line for line in err.splitlines() if line.startswith("warning:")])


# -- the collection itself ---------------------------------------------------------------------

def test_markers_are_known_and_placed():
    problems = [p for doc in DOCUMENTS.values() for p in doc.problems]
    assert not problems, "\n".join(problems)


def test_collects_the_documents_blocks():
    """A parser that silently finds nothing would pass everything: count what it finds."""
    readme = DOCUMENTS["README.md"]
    commands = [c for b in readme.blocks if b.kind == "shell" for _, c in b.commands]
    assert len(python_blocks("README.md")) >= 5
    assert "tcstage --version" in commands and len(commands) >= 12
    assert any(c.startswith("tcstage run examples/tmm.tc --target cuda-emulated --options "
                            '"MappingOptions().tile(32, 32)\n') for c in commands)
    for doc in ("docs/cpu.md", "docs/tuning.md", "docs/torch.md", "docs/halide.md"):
        assert python_blocks(doc), doc
    assert any(b.commands for b in DOCUMENTS["docs/tuning.md"].blocks)


def test_every_tcstage_command_names_real_functions_and_sizes(monkeypatch):
    """Flags, file, function and every size of each documented `tcstage` command are right,
    including the commands that run only in the slow step (the README's LUT example once gave
    2LUT's sizes to 1LUT, the last function of its file)."""
    monkeypatch.chdir(ROOT)
    for doc in DOCUMENTS.values():
        for block in doc.blocks:
            for _, command in block.commands:
                argv = shlex.split(command, comments=True)
                if argv[0] != "tcstage" or argv[1:] == ["--version"]:
                    continue
                args = cli._parser().parse_args(argv[1:])
                cli._check_flags(args)
                if args.command == "cache":  # (no TC file: it reads the tuning cache)
                    continue
                if args.file.endswith(".py"):  # a Halide pipeline module: it builds, with inputs
                    f, inputs, shapes = cli._halide_app(args)
                    assert len(inputs) == len(f.arguments) and shapes
                    continue
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", TCWarning)  # test_command sees them
                    fn = cli._load(args).checked
                cli.given_sizes(fn, args.sizes, fn.name)
