"""Bounded YAML for files anyone can drop: size, nesting, alias expansion and number length are checked first."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

MAX_BYTES = 1 << 20  # a manifest is a few hundred bytes; a megabyte leaves room for long `models:` lists
MAX_DEPTH = 32  # mappings and lists nested deeper than any manifest needs (PyYAML composes recursively)
MAX_WEIGHT = 200_000  # values after every alias is expanded, a scalar weighing 1 per 16 characters: what the
# loaded document would cost to copy (to JSON, to a log); an alias bomb is tiny on disk and huge here
MAX_NUMBER_CHARS = 64  # longer numbers are not configuration (a 5,000-digit int stops int() outright)
SHOWN_CHARS = 80  # how much of a value an error message quotes
# libyaml's parser (PyYAML's C binding) where it was built: the same events and the same SafeConstructor as the pure
# Python one, several times faster. Every limit below is checked on its events, so nothing is lost with it.
_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_NUMBER = re.compile(r"[-+]?(0[xob])?[0-9_.:eE+-]+$|[-+]?\.(inf|Inf|INF)$|\.(nan|NaN|NAN)$")


class YamlRefused(ValueError):
    """A document that is too big, too deep or too expensive to build; the message says which limit."""


def shown(value: object, limit: int = SHOWN_CHARS) -> str:
    """repr(value) cut to `limit` characters, so an echoed value never copies a huge input into a message."""
    text = repr(value) if not isinstance(value, str) else repr(value[: limit + 1])
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} chars)"


@dataclass
class _Frame:
    anchor: str | None
    nodes: int = 1
    keys: set[str] | None = None  # a mapping's plain keys seen so far (None: a sequence, or the document)
    at_key: bool = True  # a mapping's next node is a key


def _node(frame: _Frame, event: yaml.Event) -> None:
    """One node in `frame`: a key of a mapping said twice is refused (YAML takes the last one silently: `limits:`
    given twice dropped the first block, `target: cubie` then `target: host` compiled for the host)."""
    if frame.keys is None:
        return
    if frame.at_key and isinstance(event, yaml.ScalarEvent) and event.value != "<<":
        if event.value in frame.keys:
            line = event.start_mark.line + 1 if event.start_mark else 0
            raise YamlRefused(f"the key `{shown(event.value)[1:-1]}` is given twice (again at line {line})")
        frame.keys.add(event.value)
    frame.at_key = not frame.at_key


def _syntax(exc: yaml.YAMLError) -> str:
    """A YAML error without the quoted source line (it may hold a password)."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or type(exc).__name__
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return f"{problem}{where}"


def _scalar(event: yaml.ScalarEvent) -> None:
    value = event.value
    # a plain scalar: style None from the Python parser, "" from libyaml
    if event.implicit[0] and not event.style and len(value) > MAX_NUMBER_CHARS and _NUMBER.match(value):
        line = event.start_mark.line + 1 if event.start_mark else 0
        raise YamlRefused(f"a number of {len(value)} characters at line {line} (at most {MAX_NUMBER_CHARS})")


def _events(text: str) -> Iterator[yaml.Event]:
    """The document's events; libyaml's own nesting bound (1,000 levels, met while it scans ahead of the events it
    gave) is refused as ours is."""
    try:
        yield from yaml.parse(text, Loader=_LOADER)
    except yaml.MarkedYAMLError as exc:
        if "nesting depth" not in str(exc.problem):
            raise
        line = exc.problem_mark.line + 1 if exc.problem_mark else 0
        raise YamlRefused(f"nested deeper than {MAX_DEPTH} levels at line {line}") from None


def check(text: str) -> None:
    """Walk the event stream (iterative, no objects built) and refuse what would be costly to load."""
    anchors: dict[str, int] = {}
    stack: list[_Frame] = [_Frame(None, 0)]
    for event in _events(text):
        if isinstance(event, yaml.AliasEvent):
            _node(stack[-1], event)
            size = anchors.get(event.anchor or "", 1)
        elif isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            _node(stack[-1], event)
            stack.append(_Frame(event.anchor, keys=set() if isinstance(event, yaml.MappingStartEvent) else None))
            if len(stack) > MAX_DEPTH + 1:
                line = event.start_mark.line + 1 if event.start_mark else 0
                raise YamlRefused(f"nested deeper than {MAX_DEPTH} levels at line {line}")
            continue
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            done = stack.pop()
            size = done.nodes
            if done.anchor:
                anchors[done.anchor] = size
        elif isinstance(event, yaml.ScalarEvent):
            _scalar(event)
            _node(stack[-1], event)
            size = 1 + len(event.value) // 16
            if event.anchor:
                anchors[event.anchor] = size
        else:
            continue
        stack[-1].nodes += size
        if sum(f.nodes for f in stack) > MAX_WEIGHT:
            raise YamlRefused("too large once its aliases are expanded (an alias bomb?)")


def load(path: Path) -> Any:
    """The YAML document in `path`, or YamlRefused / FileNotFoundError / UnicodeDecodeError.

    Every other failure of the parser (RecursionError, MemoryError, ValueError of int()) becomes YamlRefused, so a
    poison file fails as itself and never takes the caller down.
    """
    with path.open("rb") as fh:
        return loads(fh.read(MAX_BYTES + 1))


def loads(raw: bytes) -> Any:
    """The YAML document in `raw` (at most MAX_BYTES), as load() reads a file's."""
    if len(raw) > MAX_BYTES:
        raise YamlRefused(f"larger than {MAX_BYTES} bytes")
    text = raw.decode("utf-8")
    try:
        check(text)
        return yaml.load(text, Loader=_LOADER)  # noqa: S506 (a safe loader)
    except YamlRefused:
        raise
    except yaml.YAMLError as exc:
        raise YamlRefused(f"not valid YAML: {_syntax(exc)}") from None
    except (RecursionError, MemoryError, ValueError, OverflowError, TypeError) as exc:
        raise YamlRefused(f"cannot be loaded: {type(exc).__name__}") from None
