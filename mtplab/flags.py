"""The command line's flags, shared by every mtplab command (pure Python, never torch).

    FlagParser           argparse with one-line usage errors (exit 2); `parse` returns the
                         exit code instead of raising SystemExit
    positive_int, ...    argparse `type=` functions: a bad value is refused by argparse in one
                         line naming the flag (`mtplab X: error: argument --port: ...`), before
                         anything runs; output paths are checked, never made
    add_knob_flags       one --flag per field of a dataclass (RunConfig), help text from the
                         field's `knob()` metadata: `mtplab run` and `mtplab sglang launch`
                         speak the same dialect (`--overlap true`, `--page-size 16`)
    as_flags             a field-named error message in flag names (`page_size=3` ->
                         `--page-size 3`)
"""
from __future__ import annotations

import argparse
import math
import re
from dataclasses import MISSING, fields
from typing import Any, Optional

from .validate import check_device, check_out_dir, check_out_file, check_port

TRUE, FALSE = ("true", "1", "yes"), ("false", "0", "no")


class FlagParser(argparse.ArgumentParser):
    """Usage errors in one line (the prog, the problem, where to look) and exit status 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def parse(self, argv) -> argparse.Namespace | int:
        """parse_args, or the exit code of --help (0) or a usage error (2), already printed."""
        try:
            return self.parse_args(argv)
        except SystemExit as e:
            return int(e.code or 0)


def flag_type(check):
    """An argparse type from `check(text) -> value` that raises ValueError (ConfigError
    included): argparse then prints the check's own sentence, naming the flag."""
    def convert(text: str):
        try:
            return check(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e).rstrip(".")) from None
    convert.__name__ = check.__name__
    return convert


@flag_type
def parse_bool(text: str) -> bool:
    """true/false, 1/0, yes/no in any case; anything else is refused."""
    t = text.strip().lower()
    if t in TRUE or t in FALSE:
        return t in TRUE
    raise ValueError(f"expected true/false/1/0/yes/no, got {text!r}")


@flag_type
def parse_floats(text: str) -> tuple[float, ...]:
    """Comma-separated numbers, e.g. 0.5,0.5,0.5."""
    try:
        return tuple(float(x) for x in text.split(","))
    except ValueError:
        raise ValueError(f"expected comma-separated numbers such as 0.8,0.6,0.4, got "
                         f"{text!r}") from None


def _number(text: str, integer: bool, allow_zero: bool):
    try:
        v = int(text) if integer else float(text)
    except ValueError:
        raise ValueError(f"expected {'an integer' if integer else 'a number'}, got "
                         f"{text!r}") from None
    if not math.isfinite(v) or v < 0 or (v == 0 and not allow_zero):
        what = ("a non-negative " if allow_zero else "a positive ") + (
            "integer" if integer else "finite number")
        raise ValueError(f"must be {what}, got {text!r}")
    return v


def _number_type(name: str, integer: bool, allow_zero: bool):
    convert = flag_type(lambda text: _number(text, integer, allow_zero))
    convert.__name__ = name
    return convert


positive_int = _number_type("positive_int", True, False)
nonneg_int = _number_type("nonneg_int", True, True)
positive_number = _number_type("positive_number", False, False)      # finite, > 0
nonneg_number = _number_type("nonneg_number", False, True)           # finite, >= 0


def add_request_flags(g, *, prompts: int, max_new_tokens: int) -> None:
    """--prompts and --max-new-tokens, as every command that sends requests takes them."""
    g.add_argument("--prompts", type=positive_int, default=prompts, metavar="N",
                   help=f"number of requests (default: {prompts})")
    g.add_argument("--max-new-tokens", type=positive_int, default=max_new_tokens, metavar="N",
                   help=f"tokens generated per request, ignore_eos (default: {max_new_tokens})")


@flag_type
def port_number(text: str) -> int:
    try:
        return check_port(int(text))
    except ValueError:
        raise ValueError(f"{text!r} is not a TCP port; use a number in 1..65535") from None


@flag_type
def device_name(text: str) -> str:
    check_device(text)
    return text


@flag_type
def out_dir(text: str) -> str:
    return str(check_out_dir(text, "folder"))


@flag_type
def out_file(text: str) -> str:
    return str(check_out_file(text, "file"))


# -- a dataclass's fields as flags -------------------------------------------------------------
def flag_of(name: str) -> str:
    return "--" + name.replace("_", "-")


def _converter(annotation: Any):
    """The argparse type of a field from its annotation (a string: postponed)."""
    a = str(annotation)
    if "bool" in a:
        return parse_bool
    if "tuple" in a:
        return parse_floats
    return int if "int" in a else float if "float" in a else str


def add_knob_flags(p: argparse.ArgumentParser, cls, *, title: str, defaults: Optional[dict] = None,
                   types: Optional[dict] = None, choices: Optional[dict] = None,
                   notes: Optional[dict] = None, metavars: Optional[dict] = None) -> None:
    """One --flag per field of dataclass `cls`: help from the field's `knob` metadata, its
    choices and its default. Flags default to None (= the default) so only given ones are
    passed on. `defaults` / `types` / `choices` / `metavars` replace a field's default shown
    ("": none shown), argparse type, choices and metavar; `notes` adds a sentence to its help
    (e.g. what a command does with it)."""
    defaults, types, choices = (defaults or {}), (types or {}), (choices or {})
    notes, metavars = (notes or {}), (metavars or {})
    g = p.add_argument_group(title)
    for f in fields(cls):
        conv = _converter(f.type)
        default = defaults.get(f.name, f.default if f.default is not MISSING else None)
        allowed = choices.get(f.name, f.metadata.get("choices"))
        kw = {"choices": allowed} if allowed else {}
        metavar = metavars.get(f.name, {parse_bool: "{true,false}", parse_floats: "X,Y,...",
                                        int: "N", float: "X", str: None if kw else "TEXT"}[conv])
        text = f.metadata.get("help", "")
        if f.name in notes:
            text += f"; {notes[f.name]}"
        if default != "" and (f.name in defaults or not (default is None and "(None:" in text)):
            text += f" (default: {default})"             # else the text says what None means
        p_type = types.get(f.name, conv)
        g.add_argument(flag_of(f.name), dest=f.name, default=None, type=p_type,
                       metavar=metavar, help=text, **kw)


def given(args: argparse.Namespace, cls) -> dict:
    """{field: value} of the flags of `cls` given on the command line."""
    return {f.name: getattr(args, f.name) for f in fields(cls)
            if getattr(args, f.name, None) is not None}


def _flag_value(v: str) -> str:
    v = v.strip("'\"")
    return {"True": "true", "False": "false"}.get(v, v)


def as_flags(message: str, flags: dict[str, str]) -> str:
    """`message` with field names as flags: `name=value` -> `--flag value` for every name of
    `flags` (name -> flag), and a bare `name` -> `--flag` for names with an underscore (a bare
    `draft` or `model` is an English word; `num_steps+1` is arithmetic and `/x/trace_dir/` a
    path, left alone)."""
    for name in sorted(flags, key=len, reverse=True):
        flag = flags[name]
        message = re.sub(rf"(?<![\w./-]){name}=('[^']*'|\"[^\"]*\"|[\w.:/+-]*\w)",
                         lambda m, flag=flag: f"{flag} {_flag_value(m.group(1))}", message)
        if "_" in name:
            message = re.sub(rf"(?<![\w./-]){name}(?![\w+*=/-])", flag, message)
    return message


def knob_flags(cls) -> dict[str, str]:
    """field -> its flag, for `as_flags`."""
    return {f.name: flag_of(f.name) for f in fields(cls)}

