"""Options declared once: a config dataclass's field carries its help, bounds, choices, flag
and whether a resumed run may change it (``option``), and everything else is generated from
it: the command line and its ``--help`` (``add_options``), the field checks a config runs
(``check_options``), the docs' option tables (``options_table``), the resume rules
(``resumable``) and recipes read from YAML (``read_recipe``), as TRL's ``GRPOConfig`` fields
carry ``metadata={"help": ...}`` for ``TrlParser``.

Why not ``HfArgumentParser`` itself: importing it imports transformers (about a second, where
``llm-gym --help`` answers in a third of one), it adds an underscored spelling of every flag
(``--max_new_tokens`` beside ``--max-new-tokens``, ``--no_packing``), and it refuses the union
fields a config here needs (``report_to: str | list[str]``); its per-field ``metadata`` is the
shape kept here, the argparse it builds is the same, and pyyaml (its recipe reader) reads
``--config``. This module imports nothing heavy.

>>> from dataclasses import dataclass
>>> @dataclass
... class Demo:
...     steps: int = option(4, help="how many", low=1, resumable=True)
...     mode: str = option("a", help="which one", choices=("a", "b"))
>>> parser = argparse.ArgumentParser(prog="demo")
>>> add_options(parser, Demo)
>>> parser.parse_args(["--steps", "8"])
Namespace(steps=8, mode='a')
>>> check_options(Demo(steps=0))
Traceback (most recent call last):
...
ValueError: steps must be an int >= 1, got 0
>>> resumable(Demo), flags(Demo)
(('steps',), {'steps': '--steps', 'mode': '--mode'})
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any

from llm_gym.checks import check_bool, check_choice, check_int, check_number

__all__ = [
    "KeyValues",
    "OptionSpec",
    "add_options",
    "check_options",
    "env_arg",
    "flags",
    "number",
    "option",
    "option_specs",
    "options_table",
    "read_recipe",
    "redeclare",
    "resumable",
]

_JSON_STARTS = ("{", "[", '"')  # a KEY=VALUE value meant as JSON
_KINDS = {"bool": bool, "int": int, "float": float, "str": str, "dict": dict, "list": list}


def option(
    default: Any = dataclasses.MISSING,
    *,
    help: str,
    flag: str | None = None,
    low: float | None = None,
    strict: bool = False,
    choices: Collection[object] | None = None,
    metavar: str | None = None,
    parse: Callable[[str], Any] | None = None,
    const: object = None,
    shown: str | None = None,
    resumable: bool = False,
    default_factory: Callable[[], Any] | Any = dataclasses.MISSING,
) -> Any:
    """A dataclass field declared once: its ``default`` (or ``default_factory``), its
    ``help`` (argparse's; ``%(default)s`` is the default), its ``flag`` (default
    ``--name-with-dashes``; ``--no-x`` for a ``bool`` that defaults to True turns it off),
    its bound ``low`` (``> low`` when ``strict``) or its ``choices``, the ``metavar`` its
    ``--help`` shows, a ``parse`` of the flag's text other than the bound's (its own
    checks), the ``const`` a flag given without a value takes, the text ``--help`` shows as
    the default where it is not the value's (``parse`` reads it as the default), and whether
    a resumed run may change it."""
    metadata = {
        "help": help, "flag": flag, "low": low, "strict": strict,
        "choices": tuple(choices) if choices is not None else None, "metavar": metavar,
        "parse": parse, "const": const, "shown": shown, "resumable": resumable,
    }  # fmt: skip
    return dataclasses.field(default=default, default_factory=default_factory, metadata=metadata)


def redeclare(cls: type, name: str, default: Any, **changes: Any) -> Any:
    """``cls``'s option ``name`` declared again with another ``default`` (a subclass's): the
    same help, bounds and flag, but for ``changes`` to ``option``'s arguments (``strict``).

    >>> from dataclasses import dataclass
    >>> @dataclass
    ... class Base:
    ...     steps: int = option(4, help="how many", low=1)
    >>> @dataclass
    ... class Longer(Base):
    ...     steps: int = redeclare(Base, "steps", 40)
    >>> Longer().steps, option_specs(Longer)[0].help
    (40, 'how many')
    """
    field = next(f for f in dataclasses.fields(cls) if f.name == name)
    return dataclasses.field(default=default, metadata={**field.metadata, **changes})


@dataclasses.dataclass(frozen=True)
class OptionSpec:
    """One option as a config declares it (``option``'s arguments, the field's name, its
    kind (``bool``, ``int``, ``float``, ``str``, ``dict``, ``list``), whether None is allowed
    and its default)."""

    name: str
    kind: type
    optional: bool
    default: Any
    help: str
    flag: str
    low: float | None
    strict: bool
    choices: tuple[object, ...] | None
    metavar: str | None
    parse: Callable[[str], Any] | None
    const: object
    shown: str | None
    resumable: bool


def _kind(annotation: object) -> tuple[type, bool]:
    # The first type of a string annotation ("int | None", "list[str] | str | None"): what
    # the flag's text becomes; None among them: optional.
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", "str")
    parts = [part.strip() for part in text.split("|")]
    return _KINDS.get(parts[0].split("[")[0], str), "None" in parts


def option_specs(cls: type) -> list[OptionSpec]:
    """The options ``cls`` declares with ``option``, in field order."""
    specs = []
    for field in dataclasses.fields(cls):
        if "help" not in field.metadata:
            continue
        meta = field.metadata
        kind, optional = _kind(field.type)
        if field.default is not dataclasses.MISSING:
            default = field.default
        else:
            default = field.default_factory()  # type: ignore[misc]
        specs.append(
            OptionSpec(
                name=field.name,
                kind=kind,
                optional=optional,
                default=default,
                help=meta["help"],
                flag=meta["flag"] or f"--{field.name.replace('_', '-')}",
                low=meta["low"],
                strict=meta["strict"],
                choices=meta["choices"],
                metavar=meta["metavar"],
                parse=meta["parse"],
                const=meta["const"],
                shown=meta["shown"],
                resumable=meta["resumable"],
            )  # fmt: skip
        )
    return specs


def flags(cls: type) -> dict[str, str]:
    """``{field: flag}`` of ``cls``'s options."""
    return {spec.name: spec.flag for spec in option_specs(cls)}


def resumable(cls: type) -> tuple[str, ...]:
    """The fields of ``cls`` that a resumed run may change."""
    return tuple(spec.name for spec in option_specs(cls) if spec.resumable)


# -- the command line --------------------------------------------------------------------


def number(kind: type, low: float, inclusive: bool = True) -> Callable[[str], int | float]:
    """argparse ``type``: a finite ``kind`` (int, float) ``>= low``, ``>`` unless ``inclusive``.

    >>> number(int, 1)("3")
    3
    >>> number(float, 0.0, False)("0")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: expected a number > 0.0, got '0'
    """
    relation = ">=" if inclusive else ">"

    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {kind.__name__}, got {text!r}") from None
        if (isinstance(value, float) and not math.isfinite(value)) or (
            value < low if inclusive else value <= low
        ):
            raise argparse.ArgumentTypeError(f"expected a number {relation} {low}, got {text!r}")
        return value

    return parse


def env_arg(text: str) -> tuple[str, Any]:
    """``KEY=VALUE``: the value as JSON when it parses, else the text; a value that starts as
    JSON (``{``, ``[``, ``"``) must parse.

    >>> env_arg("level=2"), env_arg("task=chain_sum")
    (('level', 2), ('task', 'chain_sum'))
    """
    key, sep, value = text.partition("=")
    if not sep or not key.isidentifier():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError as error:
        if value.lstrip().startswith(_JSON_STARTS):
            raise argparse.ArgumentTypeError(
                f"{key}: {value!r} looks like JSON but does not parse: {error}"
            ) from None
        return key, value  # a plain string, e.g. task=leg_counting


class KeyValues(argparse.Action):
    """A repeatable ``KEY=VALUE`` flag gathered into a dict (a copy of the default's or a
    recipe's, so neither is changed)."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: Any = None):
        key, value = values
        setattr(namespace, self.dest, {**(getattr(namespace, self.dest, None) or {}), key: value})


def _argument(spec: OptionSpec) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"dest": spec.name, "help": spec.help, "default": spec.default}
    if spec.kind is bool:
        if spec.flag.startswith("--no-"):
            kwargs["action"] = "store_false"
        elif spec.default is False:
            kwargs["action"] = "store_true"
        else:
            kwargs["action"] = argparse.BooleanOptionalAction
        return kwargs
    if spec.kind is dict:
        kwargs.update(action=KeyValues, type=spec.parse or env_arg, metavar="KEY=VALUE")
        return kwargs
    if spec.shown is not None:
        kwargs["default"] = spec.shown  # argparse reads a default given as text with its type
    if spec.parse is not None:
        kwargs["type"] = spec.parse
    elif spec.kind in (int, float) and spec.low is not None:
        kwargs["type"] = number(spec.kind, spec.kind(spec.low), not spec.strict)
    elif spec.kind in (int, float):
        kwargs["type"] = spec.kind
    if spec.choices is not None:
        kwargs["choices"] = spec.choices
    if spec.metavar is not None:
        kwargs["metavar"] = spec.metavar
    if spec.const is not None:
        kwargs.update(nargs="?", const=spec.const)
    return kwargs


def add_options(
    parser: argparse.ArgumentParser | Any, cls: type, names: Collection[str] | None = None
) -> None:
    """A flag on ``parser`` for each option of ``cls`` (those in ``names`` only, when
    given), its ``dest`` the field's name."""
    for spec in option_specs(cls):
        if names is None or spec.name in names:
            parser.add_argument(spec.flag, **_argument(spec))


def read_recipe(path: str | Path, cls: type) -> dict[str, Any]:
    """The options a YAML recipe at ``path`` sets (``trl grpo --config``'s shape: a mapping
    of option names, ``max_new_tokens`` or ``max-new-tokens``), checked to be ``cls``'s; an
    error names the file and the key."""
    import yaml  # pyyaml: transformers' dependency, imported only for a recipe

    path = Path(path)
    try:
        values = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise ValueError(f"--config {path}: cannot be read ({error.strerror})") from None
    except yaml.YAMLError as error:
        message = " ".join(str(error).split())
        raise ValueError(f"--config {path}: not YAML ({message})") from None
    if values is None:
        return {}
    if not isinstance(values, Mapping):
        raise ValueError(
            f"--config {path}: expected a mapping of option names to values, got "
            f"{type(values).__name__}"
        )
    specs = {spec.name: spec for spec in option_specs(cls)}
    recipe = {}
    for key, value in values.items():
        name = str(key).removeprefix("--").replace("-", "_")
        if name not in specs:
            raise ValueError(
                f"--config {path}: {key!r} is not an option of {cls.__name__} (its options: "
                f"{', '.join(specs)})"
            )
        recipe[name] = value
    return recipe


# -- checks and docs ---------------------------------------------------------------------


def check_options(config: object) -> None:
    """Each option of ``config`` of its kind and within its bound or choices: one
    ``ValueError``/``TypeError`` naming the first that is not."""
    for spec in option_specs(type(config)):
        value = getattr(config, spec.name)
        if value is None and spec.optional:
            continue
        if spec.choices is not None:
            check_choice(spec.name, value, spec.choices)
        elif spec.kind is bool:
            check_bool(spec.name, value)
        elif spec.kind is int:
            low = None if spec.low is None else math.floor(spec.low) + int(spec.strict)
            check_int(spec.name, value, low, optional=spec.optional)
        elif spec.kind is float:
            check_number(spec.name, value, spec.low, strict=spec.strict, optional=spec.optional)


def _default_text(spec: OptionSpec) -> str:
    if spec.shown is not None:
        return f"`{spec.shown}`"
    if spec.kind is bool and spec.flag.startswith("--no-"):
        return "on"
    if spec.default is None or spec.default == {} or spec.default == []:
        return "—"
    return f"`{spec.default}`"


def options_table(cls: type) -> str:
    """A Markdown table of ``cls``'s options: flag, field, default, whether a resume may
    change it, and the help (its ``%(default)s`` filled in)."""
    lines = [
        "| flag | field | default | resume may change | what it does |",
        "|---|---|---|---|---|",
    ]
    for spec in option_specs(cls):
        text = " ".join(spec.help.split()).replace("%(default)s", str(spec.default))
        text = text.replace("|", "\\|")
        lines.append(
            f"| `{spec.flag}` | `{spec.name}` | {_default_text(spec)} | "
            f"{'yes' if spec.resumable else 'no'} | {text} |"
        )
    return "\n".join(lines)
