"""Jupyter notebooks (``.ipynb``): their code cells converted as one module, in cell order.

A notebook runs its cells top to bottom in one namespace, so a name defined in one cell is
known in the next. The converter sees it the same way:

1. The notebook is read with ``nbformat`` (the optional extra ``torch2jax-port[notebook]``)
   and validated. Its code cells are joined into one module, each preceded by a marker
   statement of its own (``import _t2j<hex>_c<N>`` or ``"_t2j<hex>_c<N>"``; the hex is chosen
   so that it occurs nowhere in the notebook). Markers are statements, not comments: the
   converter neither drops nor moves a statement it does not know, and code it inserts
   (imports, helper functions, a training step) lands between two markers, in the cell
   of the code it belongs to. The markers of the cells up to the one holding the first
   ``import torch`` are import statements, so that the imports and helpers the converter
   adds after a file's leading imports go into that cell (or the first code cell, when code
   comes before it); the later markers are strings, which end that import block.
2. IPython lines are masked before parsing and restored after it, verbatim
   (:func:`mask_cell`): a line that starts a statement (not inside brackets, a string or
   after a backslash) and, after its indentation, begins with ``%`` or ``!``
   (``%matplotlib inline``, ``!pip install torch``), assigns one (``files = !ls``,
   ``t = %timeit -o f()``) or asks for help (``torch.nn.Linear?``, ``??f``); with the lines
   a trailing backslash continues. Each becomes a placeholder statement at its indentation.
   A cell whose first line is a cell magic (``%%time``) has its body converted when the
   magic runs Python (:data:`PYTHON_CELL_MAGICS`); any other (``%%bash``,
   ``%%writefile``) is kept as it is, not converted. An IPython line or kept cell that
   names torch (or a name the notebook imports from torch) is reported (``notebook-magic``,
   a warning): it is not converted.
3. The module goes through :func:`torch2jax.engine.convert_text`, the path every ``.py``
   file takes, and is split back at the markers. Every marker must come back once, in
   order, as a whole line at the top level, and every placeholder once, in its own cell
   (a ``%%`` magic on its cell's first line); otherwise the notebook fails (rule
   ``notebook``) and nothing is written, rather than code being given to the wrong cell.
4. A cell whose code changed gets the new code, its outputs and execution count cleared;
   every other cell, the markdown and raw cells, the cell ids and all metadata are kept.
   The notebook is written back in its own nbformat version and JSON indentation, through
   the engine's writer (atomic, in place only over what was read).

Diagnostics name the notebook and the cell: ``cell`` is the cell's 1-based position among
all the notebook's cells (markdown cells counted), ``line`` and ``column`` count within the
cell (``nb.ipynb:cell 3:5:12: error [...]``).
"""

from __future__ import annotations

import ast
import hashlib
import io
import json
import re
import tokenize
from dataclasses import dataclass, field, replace

from torch2jax.report import Diagnostic

# cell magics whose body is Python, run by the magic: the body is converted
PYTHON_CELL_MAGICS = frozenset({"time", "timeit", "capture", "prun", "debug"})
TORCH_IMPORT = re.compile(r"^(?:import|from)[ \t]+(?:torch|torchvision)\b", re.MULTILINE)
_ASSIGN = re.compile(r"^[A-Za-z_][\w.]*(?:[ \t]*,[ \t]*[A-Za-z_][\w.]*)*[ \t]*=[ \t]*[!%]")
_HELP = re.compile(r"^(?:\?{1,2}[\w.*]+|[\w.*]+\?{1,2})[ \t]*$")
_CELL_MAGIC = re.compile(r"^%%([\w.-]+)")


class NotebookError(Exception):
    """Not a notebook that can be converted; the message says why (the caller names it)."""


@dataclass
class Magic:
    """One masked IPython line (with its backslash continuation lines)."""

    part: int  # the joined cell it is in
    line: int  # 1-based line in the cell
    text: str  # the original lines, without the last newline
    indent: str
    cell_magic: bool = False  # a %%magic on its cell's first line


@dataclass
class Part:
    """One code cell in the joined module."""

    cell: int  # 0-based position among all the notebook's cells
    source: str  # the cell's source as read
    masked: str  # with its IPython lines masked, ending with a newline
    marker_line: int = 0  # 1-based line of its marker in the joined module

    @property
    def lines(self) -> int:
        return self.masked.count("\n")


@dataclass
class Joined:
    """The code cells of a notebook as one module (see the module docstring)."""

    tag: str
    parts: list[Part]
    magics: list[Magic]
    text: str
    kept: list[tuple[int, str]] = field(default_factory=list)  # (cell, source) not converted

    def locate(self, line: int) -> tuple[int, int] | None:
        """``(0-based cell, 1-based line in it)`` of a line of the joined module; None for a
        marker line (a problem of the whole notebook)."""
        for part in reversed(self.parts):
            if line > part.marker_line:
                return part.cell, line - part.marker_line
            if line == part.marker_line:
                return None
        return None

    def map(self, d: Diagnostic) -> Diagnostic:
        """``d`` (at a line of the joined module) at its cell and line there."""
        where = self.locate(d.line)
        if where is None:
            return replace(d, line=1, column=1)
        message = d.message
        if d.rule == "parse":  # libcst's "error at LINE:COL" counts in the joined module
            def at(mt: re.Match[str]) -> str:
                inner = self.locate(int(mt.group(1)))
                return f"error at {inner[1]}:{mt.group(2)}" if inner else mt.group(0)

            message = re.sub(r"error at (\d+):(\d+)", at, message)
        return replace(d, cell=where[0] + 1, line=where[1], message=message)


def _complete(text: str) -> bool:
    """Whether ``text`` ends between statements (no open bracket, string or backslash)."""
    try:
        for _ in tokenize.generate_tokens(io.StringIO(text).readline):
            pass
    except tokenize.TokenError:
        return False
    except (SyntaxError, ValueError):
        return True  # not Python whatever comes next: the parser reports it
    return True


def _is_ipython(stripped: str) -> bool:
    if stripped[:1] in ("%", "!"):
        return not stripped.startswith("!=")
    if _ASSIGN.match(stripped):
        return True
    return "?" in stripped and _HELP.match(stripped) is not None


def mask_cell(source: str, part: int, tag: str, first_magic: int,
              python_cell_magic: bool = False) -> tuple[str, list[Magic]]:
    """``source`` with its IPython lines replaced by placeholder statements (the same number
    of lines), and the lines masked. ``first_magic``: the number of the first placeholder.
    ``python_cell_magic``: the first line is a ``%%`` magic whose body is Python."""
    lines = source.split("\n")
    out: list[str] = []
    magics: list[Magic] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        stripped = line.lstrip(" \t")
        indent = line[:len(line) - len(stripped)]
        first = i == 0 and python_cell_magic
        if first or (stripped and _is_ipython(stripped) and _complete("\n".join(out) + "\n")):
            j = i
            while lines[j].endswith("\\") and j + 1 < len(lines) and not first:
                j += 1
            n = first_magic + len(magics)
            magics.append(Magic(part, i + 1, "\n".join(lines[i:j + 1]), indent,
                                cell_magic=first))
            name = f"{tag}_m{n}"
            out.append(f"{indent}import {name}" if not indent else f'{indent}"{name}"')
            out += [f"{indent}# {name}_cont"] * (j - i)
            i = j + 1
            continue
        out.append(line)
        i += 1
    text = "\n".join(out)
    return (text if text.endswith("\n") else text + "\n"), magics


def _tag(text: str) -> str:
    """An identifier prefix that occurs nowhere in ``text`` (the same for the same text)."""
    salt = 0
    while True:
        digest = hashlib.sha256(f"{salt}:{text}".encode("utf-8", "surrogatepass")).hexdigest()
        tag = f"_t2j{digest[:10]}"
        if tag not in text:
            return tag
        salt += 1


def _cell_magic(source: str) -> str | None:
    mt = _CELL_MAGIC.match(source)
    return mt.group(1) if mt else None


def join(cells: list[tuple[int, str]]) -> Joined:
    """The module of the code cells ``(position, source)``, in order."""
    tag = _tag("\n".join(src for _, src in cells))
    parts: list[Part] = []
    magics: list[Magic] = []
    kept: list[tuple[int, str]] = []
    for cell, source in cells:
        magic = _cell_magic(source)
        if magic is not None and magic not in PYTHON_CELL_MAGICS:
            kept.append((cell, source))
            continue
        masked, found = mask_cell(source, len(parts), tag, len(magics),
                                  python_cell_magic=magic is not None)
        parts.append(Part(cell, source, masked))
        magics += found
    # the import-statement markers reach the first cell that imports torch (module docstring)
    torch_part = next((k for k, p in enumerate(parts) if TORCH_IMPORT.search(p.masked)), -1)
    chunks = []
    line = 1
    for k, p in enumerate(parts):
        name = f"{tag}_c{k}"
        chunks.append(f"import {name}\n" if k <= torch_part else f'"{name}"\n')
        p.marker_line = line
        chunks.append(p.masked)
        line += 1 + p.lines
    return Joined(tag, parts, magics, "".join(chunks), kept)


def _marker_re(tag: str, kind: str) -> re.Pattern[str]:
    return re.compile(rf'^(?P<indent>[ \t]*)(?:import {tag}_{kind}(?P<a>\d+)|"{tag}_{kind}'
                      rf'(?P<b>\d+)")[ \t]*$')


def _edges(text: str) -> tuple[str, str, str]:
    """``(leading blank lines, the rest, trailing blank lines and newlines)`` of ``text``."""
    lead = re.match(r"(?:[ \t]*\n)*", text).group(0)  # type: ignore[union-attr]
    rest = text[len(lead):]
    core = re.sub(r"(?:\n[ \t]*)+\Z", "", rest)
    return lead, core, rest[len(core):]


def split(joined: Joined, code: str) -> list[str]:
    """Each part's converted source, its IPython lines restored, its leading and trailing
    blank lines as in the cell read. Raises :class:`NotebookError` when a marker or a
    placeholder did not come back once, in place: every line of ``code`` that holds the tag
    must be a cell marker (at the top level, in order), a placeholder (in its own cell, once)
    or a placeholder's continuation comment."""
    tag = joined.tag
    cell_re, magic_re = _marker_re(tag, "c"), _marker_re(tag, "m")
    cont_re = re.compile(rf"[ \t]*(?:#[ \t]*)*# {tag}_m\d+_cont[ \t]*")
    # a placeholder in code the converter commented out: the IPython line is commented out
    commented_re = re.compile(rf'^(?P<prefix>[ \t]*#[ \t]?)(?P<indent>[ \t]*)(?:import {tag}_m'
                              rf'(?P<a>\d+)|"{tag}_m(?P<b>\d+)")[ \t]*$')
    chunks: list[list[str]] = [[]]
    for ln in code.split("\n"):
        mt = cell_re.match(ln)
        if mt is not None:
            if mt.group("indent") or int(mt.group("a") or mt.group("b")) != len(chunks) - 1:
                raise NotebookError("the conversion moved a cell boundary")
            chunks.append([])
        else:
            chunks[-1].append(ln)
    if len(chunks) != len(joined.parts) + 1:
        raise NotebookError("the conversion moved or dropped a cell boundary")
    # what the converter put before the first marker belongs to the first code cell
    chunks[1][:0] = [ln for ln in chunks[0] if ln.strip()]
    seen: set[int] = set()
    out = []
    for k, (part, body) in enumerate(zip(joined.parts, chunks[1:], strict=True)):
        lines: list[str] = []
        for ln in body:
            mt = magic_re.match(ln)
            prefix = ""
            if mt is None and (mt := commented_re.match(ln)) is not None:
                prefix = mt.group("prefix")
            if mt is None:
                if cont_re.fullmatch(ln):
                    continue
                if tag in ln:
                    raise NotebookError("the conversion moved a cell boundary or an IPython "
                                        "line")
                lines.append(ln)
                continue
            n = int(mt.group("a") or mt.group("b"))
            if n >= len(joined.magics) or joined.magics[n].part != k or n in seen:
                raise NotebookError("the conversion moved an IPython line to another cell")
            seen.add(n)
            first, *rest = joined.magics[n].text.split("\n")
            lines += [prefix + mt.group("indent") + first.lstrip(" \t"),
                      *(prefix + r if prefix else r for r in rest)]
        # the blank lines around the cell's code as they were (the converter separates what
        # it inserts with blank lines, and the markers are gone)
        _, core, _ = _edges("\n".join(lines))
        lead, old_core, trail = _edges(part.source)
        if core:
            new = lead + core + trail
        else:  # the converter removed all of it (a cell of torch imports), or it was blank
            new = "" if old_core else part.source
        if any(m.cell_magic and m.part == k for m in joined.magics) and not core.startswith(
                "%%"):
            raise NotebookError("the conversion moved a cell magic off its cell's first line")
        out.append(new)
    if len(seen) != len(joined.magics):
        raise NotebookError("the conversion dropped an IPython line")
    return out


def _torch_names(joined: Joined) -> set[str]:
    """``torch``, ``torchvision`` and the names the notebook's torch imports bind."""
    names = {"torch", "torchvision"}
    try:
        tree = ast.parse(joined.text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return names
    for node in tree.body:
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] in ("torch", "torchvision"):
                    names.add(a.asname or a.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level and (
                node.module.split(".")[0] in ("torch", "torchvision")):
            names |= {a.asname or a.name for a in node.names if a.name != "*"}
    return names


def magic_diagnostics(joined: Joined, path: str) -> list[Diagnostic]:
    """A warning for each IPython line and each kept cell that names torch: ``torch`` or
    ``torchvision``, or (in a ``%`` magic, whose arguments are Python) a name the notebook's
    torch imports bind (``nn``, ``F``)."""
    shell = re.compile(r"\btorch")
    names = sorted(_torch_names(joined))
    python = re.compile(r"(?<![\w.])(?:" + "|".join(re.escape(n) for n in names) + r")\b")
    out = []
    for m in joined.magics:
        pattern = python if m.text.lstrip().startswith("%") else shell
        if pattern.search(m.text):
            first = m.text.split("\n")[0].strip()
            what = "cell magic" if m.cell_magic else "IPython line"
            out.append(Diagnostic(path, m.line, len(m.indent) + 1, "notebook-magic", "warning",
                                  f"{what} `{first}` names torch; kept as it is (IPython lines "
                                  "are not converted): check it by hand",
                                  joined.parts[m.part].cell + 1))
    for cell, source in joined.kept:
        if shell.search(source):
            first = source.split("\n")[0].strip()
            out.append(Diagnostic(path, 1, 1, "notebook-magic", "warning",
                                  f"`{first}` cell names torch; kept as it is (only Python "
                                  "cells are converted): check it by hand", cell + 1))
    return out


# --- reading and writing -----------------------------------------------------------------------


def _nbformat():
    try:
        import nbformat
    except ImportError:
        raise NotebookError("reading a notebook needs nbformat: pip install nbformat (the "
                            "extra torch2jax-port[notebook])") from None
    return nbformat


def read_notebook(data: bytes):
    """``(notebook as nbformat 4, its original major version, text)``; raises
    :class:`NotebookError`."""
    nbformat = _nbformat()
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise NotebookError(f"not valid UTF-8: byte 0x{data[exc.start]:02x} at offset "
                            f"{exc.start}") from None
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            nb = nbformat.reader.reads(text)
        except nbformat.reader.NotJSONError:
            raise NotebookError("not a notebook: not JSON") from None
        except (nbformat.reader.NBFormatError, ValueError, KeyError, TypeError) as exc:
            raise NotebookError(f"not a notebook: {exc}") from None
        major = nb.get("nbformat")
        try:
            if major != 4:
                nb = nbformat.convert(nb, 4)
            _fill_ids(nb)
            nbformat.validate(nb)
        except nbformat.ValidationError as exc:
            raise NotebookError(f"not a valid notebook (nbformat): {exc.message}") from None
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise NotebookError(f"not a valid notebook (nbformat): {exc}") from None
    return nb, major, text


def _fill_ids(nb) -> None:
    """Cell ids for a notebook (4.5 and later) that lacks some: derived from the cell's
    position, so that a conversion writes the same file every time (nbformat's own repair
    draws them at random)."""
    if (nb.get("nbformat"), nb.get("nbformat_minor", 0)) < (4, 5):
        return
    taken = {c.get("id") for c in nb.cells}
    for i, cell in enumerate(nb.cells):
        if not cell.get("id"):
            k = 0
            while (new := hashlib.sha256(f"{i}:{k}".encode()).hexdigest()[:8]) in taken:
                k += 1
            cell["id"] = new
            taken.add(new)


def is_python(nb) -> bool:
    """Whether the notebook's kernel runs Python (a notebook that does not say is taken as
    Python)."""
    meta = nb.get("metadata", {})
    lang = (meta.get("kernelspec") or {}).get("language") or (
        meta.get("language_info") or {}).get("name")
    return lang is None or str(lang).lower().startswith("python")


def code_cells(nb) -> list[tuple[int, str]]:
    return [(i, c.source) for i, c in enumerate(nb.cells) if c.cell_type == "code"]


def python_source(data: bytes, max_bytes: int | None = None) -> bytes:
    """The module a notebook's code cells make (for the repository's first pass). Raises
    ``OSError`` when it is not a notebook that can be read, or its code is over ``max_bytes``."""
    if b"torch" not in data:
        return b""
    try:
        nb, _, _ = read_notebook(data)
    except NotebookError as exc:
        raise OSError(str(exc)) from None
    text = join(code_cells(nb)).text.encode("utf-8", "surrogatepass")
    if max_bytes is not None and len(text) > max_bytes:
        raise OSError("code over the size limit")
    return text


def _indent_of(text: str) -> int | str | None:
    """The JSON indentation of a notebook file (nbformat writes 1; some editors 2 or tabs)."""
    mt = re.match(r"\{\r?\n([ \t]+)\"", text)
    if mt is None:
        return None
    ws = mt.group(1)
    return ws if "\t" in ws else len(ws)


def write_notebook(nb, major: int, original: str) -> str:
    """The notebook's JSON in nbformat ``major`` (nbformat's writer), indented as
    ``original`` was (nbformat always writes an indent of 1)."""
    nbformat = _nbformat()
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        text = nbformat.writes(nb, version=major)
    indent = _indent_of(original)
    if indent is not None and indent != 1:
        text = json.dumps(json.loads(text), indent=indent, sort_keys=True,
                          separators=(",", ": "), ensure_ascii=False)
    if original.endswith("\n") and not text.endswith("\n"):
        text += "\n"
    return text
