"""Notebook parameters typed and range-checked before anything runs (``moespec reproduce -p``,
``moespec sweep``).

The type of each parameter is that of its default in the notebook's ``parameters`` cell (an int
default takes integers, a float default numbers, a list default a list of the items' type, a bool
True or False, a str text, a dict a dict). A default of ``None`` ("the profile's value") takes the
type of the profile values in :data:`moespec.notebook_profiles.DEFAULTS`, or ``None``. Two dict
parameters have typed keys (:data:`DICT_PARAMETERS`): ``subject`` (the fields of
:class:`moespec.notebook_profiles.SubjectSpec`) and ``sizes`` (the notebook's profile sizes); each
key is checked as a parameter of its own name would be. The ranges and choices the notebooks need
are declared beside them here, by parameter name (:data:`RULES`, with :data:`NOTEBOOK_RULES` for a
name that means something else in one notebook), e.g. ``kmax >= 1``, ``profile`` one of
quick/full, an acceptance rate in [0, 1).

Paths given by the user are resolved against the user's working directory (``base``), not the
notebooks' (papermill runs a notebook in ``notebooks/``): a path parameter's relative value is
made absolute; an input path that does not exist and an output folder that cannot be created are
refused. Every refusal names the notebook, the parameter, what was expected and what was found.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from .errors import InputError, describe
from .outputs import writable_folder


@dataclass(frozen=True)
class Rule:
    """What a parameter's value (or each item of a list) must be beyond its type: ``low``/``high``
    (``low_open``/``high_open``: excluded), ``choices``, a regular expression ``pattern``,
    ``nonempty`` (a list of at least one item), and for paths ``path``: ``"input"`` (a file or
    folder that must exist), ``"maybe"`` (a path, or a name the notebook looks up: resolved when
    it exists), ``"output"`` (a folder that must be creatable); ``keywords``: values of a path
    parameter that are not paths; ``text``: the rule in words, where the parts do not say it well.
    The empty string always means "the notebook's default" for a path."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    choices: tuple | None = None
    pattern: str | None = None
    nonempty: bool = False
    path: str | None = None
    keywords: tuple = ()
    text: str = ""

    def describe(self) -> str:
        if self.text:
            return self.text
        parts = []
        if self.low is not None:
            parts.append(f"{'>' if self.low_open else '>='} {self.low:g}")
        if self.high is not None:
            parts.append(f"{'<' if self.high_open else '<='} {self.high:g}")
        if self.choices:
            parts.append(f"one of {list(self.choices)}")
        if self.pattern:
            parts.append(f"matching {self.pattern!r}")
        return " and ".join(parts)


_COUNT = Rule(low=1)            # sizes, repetitions, tokens: at least one
_NONNEG = Rule(low=0)
_RATE = Rule(low=0, high=1, high_open=True)   # an acceptance rate a in [0, 1)
_BACKENDS = Rule(choices=("auto", "torch", "cpp", "cuda"))

#: Ranges and choices by parameter name (every notebook that declares the name).
RULES: dict[str, Rule] = {
    "profile": Rule(choices=("quick", "full")),
    "device": Rule(pattern=r"cpu|cuda(:\d+)?", text="'cpu', 'cuda' or 'cuda:<index>'"),
    "seed": _NONNEG,
    "threads": _NONNEG, "untimed_threads": _NONNEG,
    "resamples": _COUNT, "n_max": Rule(low=2), "kmax": _COUNT, "layers": _NONNEG,
    "smollm2_tokens_per_article": _COUNT, "eval_words_per_article": _COUNT, "num_groups": _COUNT,
    "group_top_k": _COUNT, "calibration_articles": _COUNT, "calibration_tokens": _COUNT,
    "recorded_split": Rule(choices=("test", "valid", "all")),
    "backend": _BACKENDS,
    "dense_ratio": _NONNEG, "eps_override": Rule(low=0, high=0.5, high_open=True),
    "draft_cost": _NONNEG, "draft_costs": _NONNEG,
    "depths": Rule(low=1, nonempty=True), "prompts_per_depth": _COUNT, "verify_reps": _COUNT, "n_boot": _COUNT,
    "oracle_ks": Rule(low=0, nonempty=True), "a_values": Rule(low=0, high=1, high_open=True, nonempty=True),
    "n_tokens": _COUNT, "oracle_prompts": _COUNT, "oracle_reps": _COUNT, "real_ks": Rule(low=1, nonempty=True),
    "real_tokens": _COUNT, "real_prompts": _COUNT, "agree_tokens": _COUNT, "breakdown_reps": _COUNT,
    "ratio_reps": _COUNT, "noise_resamples": Rule(low=2), "draft_cal_prompts": _COUNT,
    "loaded_draft_cal_prompts": _COUNT, "loaded_real_prompts": _COUNT, "loaded_real_reps": _COUNT,
    "loaded_oracle_prompts": _COUNT, "loaded_oracle_reps": _COUNT, "loaded_draft_costs": _NONNEG,
    "cal_prompts": _COUNT, "cal_reps": _COUNT, "draft_cal_plain_runs": _COUNT, "loaded_bench_reps": _COUNT,
    "states": Rule(choices=("quiet", "loaded"), nonempty=True),
    "plain_runs": _COUNT, "real_reps": _COUNT, "wiki_docs": _COUNT, "context": _COUNT, "bench_reps": _COUNT,
    "u_count": _COUNT,
    "windows_per_n": _COUNT, "flush_bytes": _NONNEG, "membw_bytes": _COUNT,
    "oracle_a": _RATE, "lmax": _COUNT, "draft_scale": Rule(low=0, low_open=True),
    "acceptance": Rule(low=0, high=1, high_open=True, nonempty=True),
    "transfer_models": Rule(nonempty=False), "oracle_categories": Rule(nonempty=True),
    # paths
    "bandwidth_csv": Rule(path="input"), "breadth_csv": Rule(path="input"), "epsilon_csv": Rule(path="input"),
    "run_folder": Rule(path="input"),
    "trace_file": Rule(path="maybe", keywords=("synthetic",)),
    "model": Rule(path="maybe"), "draft": Rule(path="maybe"),
    "out_dir": Rule(path="output"),
}
#: Rules of one notebook (by its number) that differ from :data:`RULES`.
NOTEBOOK_RULES: dict[tuple[str, str], Rule] = {
    ("01", "trace_file"): Rule(path="input"),           # 01 loads it as a file (no trace-folder names)
    ("05", "threads"): _COUNT, ("06", "threads"): _COUNT, ("07", "threads"): _COUNT,
    ("09", "threads"): _COUNT, ("09", "batch_sizes"): Rule(low=1, nonempty=True),
    ("09", "ks"): Rule(low=0, nonempty=True),
    ("09", "draft_kind"): Rule(choices=("oracle", "real")), ("09", "union_resamples"): _COUNT,
    ("09", "prompt_tokens"): _COUNT, ("09", "reps"): _COUNT, ("09", "term_positions"): _COUNT,
}

_WORDS = {bool: "True or False", int: "an integer", float: "a number", str: "a text", list: "a list",
          dict: "a dict"}
#: Dict parameters whose keys are typed: name -> what gives the keys' types (:func:`dict_key_types`).
DICT_PARAMETERS = {"subject": "the fields of moespec.notebook_profiles.SubjectSpec",
                   "sizes": "the sizes of the notebook's profiles (moespec.notebook_profiles.DEFAULTS)"}


@dataclass(frozen=True)
class ParameterType:
    """The type of one parameter: ``kind`` (bool, int, float, str, list; None: any value),
    ``item`` (a list's items), ``nullable`` (None allowed: the declared default is None)."""

    kind: type | None
    item: type | None = None
    nullable: bool = False

    def describe(self) -> str:
        if self.kind is None:
            return "any value"
        text = _WORDS[self.kind] + (f" of {_WORDS[self.item].split(' ', 1)[1]}s" if self.kind is list and self.item
                                    and self.item is not bool else "")
        return text + (" or None" if self.nullable else "")


def _kind_of(value) -> type | None:
    if isinstance(value, bool):
        return bool
    if isinstance(value, int):
        return int
    if isinstance(value, float):
        return float
    if isinstance(value, str):
        return str
    if isinstance(value, (list, tuple)):
        return list
    if isinstance(value, dict):
        return dict
    return None


def _item_kind(values) -> type | None:
    kinds = {_kind_of(v) for v in values}
    if kinds == {int, float}:
        return float
    return kinds.pop() if len(kinds) == 1 else None


def type_of(default, profile_values=()) -> ParameterType:
    """The :class:`ParameterType` of a parameter declared with ``default`` (and, for a default of
    None, the profile values it stands for)."""
    if default is None:
        given = [v for v in profile_values if v is not None]
        if not given:
            return ParameterType(None, nullable=True)
        kind = _item_kind(given) if all(_kind_of(v) in (int, float) for v in given) else _kind_of(given[0])
        item = _item_kind([x for v in given if isinstance(v, (list, tuple)) for x in v]) if kind is list else None
        return ParameterType(kind, item, nullable=True)
    kind = _kind_of(default)
    return ParameterType(kind, _item_kind(default) if kind is list else None)


def notebook_number(notebook: Path | str) -> str:
    return Path(notebook).stem.split("_", 1)[0]


def parameter_types(notebook: Path | str, declared: Mapping[str, Any]) -> dict[str, ParameterType]:
    """The type of each declared parameter (``declared``: name -> default, as the ``parameters``
    cell gives them)."""
    number = notebook_number(notebook)
    profile_table = None
    if any(v is None for v in declared.values()):
        from moespec.notebook_profiles import DEFAULTS   # imports torch: only for notebooks that need it

        profile_table = DEFAULTS.get(number, {})
    out = {}
    for name, default in declared.items():
        values = [table.get(name) for table in profile_table.values()] if profile_table else []
        out[name] = type_of(default, values)
    return out


def dict_key_types(notebook: Path | str, name: str) -> dict[str, ParameterType] | None:
    """The type of each key of the dict parameter ``name`` (:data:`DICT_PARAMETERS`), None for a
    parameter whose keys are not typed."""
    from moespec.notebook_profiles import DEFAULTS, SubjectSpec   # imports torch: only where needed

    if name == "subject":
        return {key: ParameterType(kind) for key, kind in SubjectSpec.types().items()}
    if name == "sizes":
        tables = DEFAULTS.get(notebook_number(notebook), {})
        keys = dict.fromkeys(k for table in tables.values() for k in table)
        return {key: type_of(None, [table.get(key) for table in tables.values()]) for key in keys}
    return None


def rule_for(notebook: Path | str, name: str) -> Rule | None:
    return NOTEBOOK_RULES.get((notebook_number(notebook), name), RULES.get(name))


def _convert(value, kind: type, where: str, name: str, expected: str, error):
    """``value`` as ``kind`` (an int stands for a float; "true"/"false" for a bool), or refuse."""
    def bad(hint="", wanted=expected):
        raise error(f"{where}: parameter {name!r}: expected {wanted}; found {describe(value)}"
                    f" ({type(value).__name__}){hint}", where=where, field=name, expected=wanted, found=value)

    if kind is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        bad()
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            bad()
        return int(value)
    if kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            bad()
        if not math.isfinite(value):
            bad(wanted="a finite number")
        return float(value)
    if kind is str:
        if not isinstance(value, str):
            bad(f"; quote it to pass it as text: -p {name}='\"{value}\"'")
        return value
    if kind is list:
        if not isinstance(value, (list, tuple)):
            bad()
        return list(value)
    if kind is dict:
        if not isinstance(value, dict):
            bad()
        return dict(value)
    return value


def _in_range(value, rule: Rule) -> bool:
    if rule.choices is not None and value not in rule.choices:
        return False
    if rule.pattern is not None and not (isinstance(value, str) and re.fullmatch(rule.pattern, value)):
        return False
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if rule.low is not None and (value <= rule.low if rule.low_open else value < rule.low):
            return False
        if rule.high is not None and (value >= rule.high if rule.high_open else value > rule.high):
            return False
    return True


def _resolve_path(value: str, rule: Rule, base: Path, where: str, name: str, error, local: bool = True,
                  label: str | None = None) -> str:
    """A path parameter's value with a relative path made absolute against ``base``; with
    ``local`` (the notebook runs on this machine), an input that does not exist is refused."""
    if not value or value in rule.keywords:
        return value
    shown = label or name
    given = Path(value).expanduser()
    path = given if given.is_absolute() else base / given
    missing = error(f"{where}: parameter {shown!r}: expected an existing file or folder; found {value!r}"
                    + ("" if given.is_absolute() else f" (looked for {path}, relative to {base})"),
                    where=where, field=shown, expected="an existing path", found=value)
    if rule.path == "maybe":   # a path, or a name the notebook resolves (a preset, a trace-folder file)
        looks_like_path = given.is_absolute() or value.startswith((".", "~")) or os.sep in value
        if path.exists() and (looks_like_path or name == "trace_file" or (path / "config.json").is_file()):
            return str(path.resolve())
        if (given.is_absolute() or value.startswith((".", "~"))) and local:   # surely a path, and not there
            raise missing
        return value
    if rule.path == "input" and local and not path.exists():
        raise missing
    if rule.path == "output" and local:
        writable_folder(path, f"{where}: parameter {shown!r}", error)
    return str(path)


def _check_dict(notebook: Path | str, name: str, value: dict, base: Path | None, error: type[InputError],
                local: bool) -> dict:
    """A dict parameter's keys and values checked (:func:`dict_key_types`), each value as a
    parameter of the key's name; an unknown key is refused."""
    types = dict_key_types(notebook, name)
    if types is None:
        return value
    where = Path(notebook).name
    out = {}
    for key, v in value.items():
        if key not in types:
            expected = f"a key of {DICT_PARAMETERS[name]}: {sorted(types)}"
            raise error(f"{where}: parameter {name!r}: expected {expected}; found key {key!r}",
                        where=where, field=f"{name}.{key}", expected=expected, found=key)
        out[key] = check_value(notebook, key, v, types[key], base, error, local, label=f"{name}.{key}")
    return out


def check_value(notebook: Path | str, name: str, value, ptype: ParameterType, base: Path | None = None,
                error: type[InputError] = InputError, local: bool = True, label: str | None = None):
    """``value`` of parameter ``name`` checked (type, range) and normalized (ints for floats made
    floats, relative paths made absolute against ``base``, default the working directory; a dict
    parameter's keys by :func:`_check_dict`). ``local``: the notebook runs on this machine, so input
    paths must exist here. ``label``: how refusals name the value (default ``name``; a key of a dict
    parameter is checked under its own name and named ``parameter.key``)."""
    where = Path(notebook).name
    rule = rule_for(notebook, name)
    shown = label or name
    if value is None:
        if ptype.nullable:
            return None
        raise error(f"{where}: parameter {shown!r}: expected {ptype.describe()}; found None",
                    where=where, field=shown, expected=ptype.describe(), found=None)
    if ptype.kind is not None:
        value = _convert(value, ptype.kind, where, shown, ptype.describe(), error)
    if ptype.kind is dict:
        return _check_dict(notebook, name, value, base, error, local)
    if ptype.kind is list:
        if rule is not None and rule.nonempty and not value:
            raise error(f"{where}: parameter {shown!r}: expected a non-empty list; found []",
                        where=where, field=shown, expected="a non-empty list", found=value)
        if ptype.item is not None:
            value = [_convert(x, ptype.item, where, f"{shown}[{i}]", _WORDS[ptype.item], error)
                     for i, x in enumerate(value)]
        items = value
    else:
        items = [value]
    if rule is not None:
        for i, x in enumerate(items):
            if not (rule.path and x == "") and not _in_range(x, rule):
                field = f"{shown}[{i}]" if ptype.kind is list else shown
                raise error(f"{where}: parameter {field!r}: expected {rule.describe()}; found {describe(x)}",
                            where=where, field=field, expected=rule.describe(), found=x)
        if rule.path and isinstance(value, str):
            value = _resolve_path(value, rule, Path(base) if base else Path.cwd(), where, name, error, local, shown)
    return value


def check_values(notebook: Path | str, values: Mapping[str, Any], declared: Mapping[str, Any],
                 base: Path | None = None, error: type[InputError] = InputError,
                 local: bool = True) -> dict[str, Any]:
    """Every value of ``values`` (parameters a caller sets for ``notebook``, which declares
    ``declared``) checked by :func:`check_value`; returns the normalized values. Names the notebook
    does not declare are the caller's to refuse."""
    types = parameter_types(notebook, declared)
    return {name: check_value(notebook, name, v, types[name], base, error, local) if name in types else v
            for name, v in values.items()}
