"""YAML as mtplab reads it (grid files, schedule files, --set values, --spec-schedule): one
safe loader, every problem one ConfigError sentence naming where the text came from.

- PyYAML's safe loader: a `!!python/...` tag is refused, never constructed.
- A key given twice in one mapping is refused (PyYAML keeps the last one silently).
- Aliases: a structure that contains itself is refused, and so is a document that holds more
  than MAX_NODES values once every alias is expanded (a few hundred bytes of nested aliases
  can stand for millions of values: "billion laughs"). Counting shares the work of repeated
  aliases, so the check itself stays cheap.
- A file that is not UTF-8 text (a binary) and, unless allowed, an empty document are refused.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Union

import yaml

from .errors import ConfigError

# The most values (scalars, lists, mappings) one document may hold with its aliases expanded.
MAX_NODES = 100_000


class _StrictLoader(yaml.SafeLoader):
    """PyYAML's safe loader, but a key given twice in one mapping is an error."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                key, line = self.construct_object(key_node, deep=True), key_node.start_mark.line
                try:
                    if key in seen:
                        raise yaml.constructor.ConstructorError(
                            None, None, f"key {key!r} is given twice in one mapping (first on "
                            f"line {seen[key] + 1}); keep one", key_node.start_mark)
                    seen[key] = line
                except TypeError:              # unhashable: PyYAML's own error follows
                    continue
        return super().construct_mapping(node, deep)


def problem(e: yaml.YAMLError) -> str:
    """A YAML error on one line: the problem and where (the parser's text spans lines); a tag
    the safe loader has no constructor for is named as such."""
    text = e.problem if isinstance(e, yaml.MarkedYAMLError) else None
    tag = re.search(r"constructor for the tag '([^']*)'", text or "")
    if tag:
        name = tag.group(1).replace("tag:yaml.org,2002:", "!!")
        text = (f"the tag {name} is not allowed (plain YAML only: mappings, lists, numbers, "
                "strings)")
    if isinstance(e, yaml.MarkedYAMLError) and e.problem_mark is not None:
        return (f"{text or e.context} (line {e.problem_mark.line + 1}, "
                f"column {e.problem_mark.column + 1})")
    return " ".join(str(e).split())


def _expanded_size(doc: Any, where: str) -> int:
    """Values in `doc` with every alias expanded, counted once per distinct object (a memo
    by id); raises on a structure that contains itself or one beyond MAX_NODES."""
    sizes: dict[int, int] = {}
    open_ids: set[int] = set()

    def size(obj: Any, at: str) -> int:
        if not isinstance(obj, (dict, list)):
            return 1
        key = id(obj)
        if key in sizes:
            return sizes[key]
        if key in open_ids:
            raise ConfigError(f"cannot read {where}: the alias at {at or 'the top'} refers to "
                              "a node that contains it; give the value itself.")
        open_ids.add(key)
        items = obj.items() if isinstance(obj, dict) else enumerate(obj)
        n = 1 + sum(size(v, f"{at}.{k}" if at else str(k)) for k, v in items)
        open_ids.discard(key)
        if n > MAX_NODES:
            raise ConfigError(f"cannot read {where}: its aliases expand to more than "
                              f"{MAX_NODES:,} values; write the values out, or use fewer "
                              "nested aliases.")
        sizes[key] = n
        return n

    return size(doc, "")


def load_yaml(text: Union[str, bytes], where: str, *, empty_ok: bool = False) -> Any:
    """The document in `text` (bytes must be UTF-8); ConfigError naming `where` for invalid
    YAML, a python tag, a duplicate key, a self-containing or oversized alias structure, a
    binary and (unless `empty_ok`) an empty document."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ConfigError(f"cannot read {where}: it is not a text file (byte "
                              f"{e.object[e.start]:#04x} at offset {e.start} is not UTF-8); "
                              "give a YAML text file.") from None
    if "\0" in text:
        raise ConfigError(f"cannot read {where}: it holds NUL bytes, so it is a binary, not "
                          "YAML; give a YAML text file.")
    try:
        doc = yaml.load(text, Loader=_StrictLoader)   # noqa: S506 -- a SafeLoader subclass
    except yaml.YAMLError as e:
        raise ConfigError(f"cannot read {where}: {problem(e)}; fix the YAML.") from None
    except RecursionError:
        raise ConfigError(f"cannot read {where}: its values nest too deep; flatten it.") \
            from None
    if doc is None and not empty_ok:
        raise ConfigError(f"{where} is empty (no YAML document); give its settings.")
    _expanded_size(doc, where)
    return doc


def read_yaml(path: Union[str, Path], where: str, *, empty_ok: bool = False) -> Any:
    """`load_yaml` of the file at `path`; a file that cannot be read is one ConfigError."""
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise ConfigError(f"cannot read {where}: {e.strerror or e}.") from None
    return load_yaml(data, where, empty_ok=empty_ok)
