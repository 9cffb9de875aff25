"""The argparse types every command line shares, refusing a bad value at parse time (the
same checks run on TOML config keys, which become flags). Numeric types state in their
error message which values are valid, so argparse's "argument --depth: ..." line names both
the flag and the fix; a value that only some flags accept (0 = default, -1 = never) is
spelled out per flag with `special`. Standard library only: the connection modules name
their own fields' types from here (FIELD_TYPES), and an exported model carries this file."""

import argparse
import math
import os


def _number(text, kind):
    """int or float from a flag string or a TOML value; ints also from '2e9' or 1e7
    (token and character counts are often written that way), never from 2.5 or a bool."""
    if isinstance(text, bool):
        raise ValueError
    if kind is float:
        return float(text)
    if isinstance(text, float):
        value = text
    else:
        try:
            return int(str(text).strip().replace("_", ""))
        except ValueError:
            value = float(text)
    if not value.is_integer():
        raise ValueError
    return int(value)


def _bound(kind, minimum, maximum, special, what, above=False, multiple=None):
    """An argparse type for a finite `kind` in [minimum, maximum] (either may be None;
    `above`: strictly greater than minimum; ints: a multiple of `multiple`), also
    accepting the values of `special` ({value: meaning})."""
    special = special or {}
    expected = " ".join([what, *(f"or {v} ({meaning})" for v, meaning in special.items())])

    def parse(text):
        try:
            value = _number(text, kind)
        except (TypeError, ValueError):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
        if value in special:
            return value
        low = minimum is not None and (value <= minimum if above else value < minimum)
        off_grid = multiple is not None and value % multiple
        if not math.isfinite(value) or low or (maximum is not None and value > maximum) or off_grid:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
        return value

    parse.__name__ = what.replace(" ", "_")
    parse.numeric = True  # lets tests find every numeric flag of a parser
    # what it accepts, stated: the tests read a wiring's fields' ranges from here
    parse.declared = dict(minimum=minimum, maximum=maximum, above=above, multiple=multiple, special=special)
    return parse


def positive_int(special=None):
    return _bound(int, 1, None, special, "a positive integer")


def nonneg_int(special=None):
    return _bound(int, 0, None, special, "an integer >= 0")


def positive_even_int():
    return _bound(int, 2, None, None, "a positive even integer", multiple=2)


def int_at_least(minimum, special=None):
    return _bound(int, minimum, None, special, f"an integer >= {minimum}")


def int_in(minimum, maximum, special=None):
    return _bound(int, minimum, maximum, special, f"an integer in [{minimum}, {maximum}]")


def positive_float(special=None):
    return _bound(float, 0, None, special, "a positive number", above=True)


def nonneg_float(special=None):
    return _bound(float, 0, None, special, "a number >= 0")


def finite_float():
    return _bound(float, None, None, None, "a finite number")


def fraction(special=None):
    return _bound(float, 0, 1, special, "a number in [0, 1]")


def boolean(text):
    """true/false, yes/no, on/off, 1/0 (or a TOML bool)."""
    if isinstance(text, bool):
        return text
    low = str(text).lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true/false, got {text!r}")


def factor_list(text):
    """KromHC factors: a TOML list, or text like 2,2,2 or 4x2; empty = the default."""
    if isinstance(text, list):
        parts = text
    else:
        text = str(text).strip()
        parts = text.replace("x", ",").split(",") if text else []
    try:
        factors = [int(v) for v in parts if not isinstance(v, (bool, float))]
    except ValueError:
        factors = None
    if factors is None or len(factors) != len(parts) or any(f < 2 for f in factors):
        raise argparse.ArgumentTypeError(f"expected factors >= 2 like 2,2 or 4x2, got {text!r}")
    return factors


factor_list.numeric = True
factor_list.declared = dict(minimum=2, maximum=None, above=False, multiple=None, special={})  # each factor


def existing_dir(text):
    """A directory that exists and can be listed; "" (a flag's unset default) passes."""
    if text == "":
        return text
    path = os.path.expanduser(str(text))
    if not os.path.isdir(path):
        raise argparse.ArgumentTypeError(f"{text!r} is not a directory")
    if not os.access(path, os.R_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"{text!r} cannot be read (permissions)")
    return path


def existing_path(text):
    """A file or directory that exists and can be read."""
    path = os.path.expanduser(str(text))
    if not os.path.exists(path):
        raise argparse.ArgumentTypeError(f"{text!r} does not exist")
    if not os.access(path, os.R_OK):
        raise argparse.ArgumentTypeError(f"{text!r} cannot be read (permissions)")
    return path


def choice(*options):
    """One of `options` (an argparse type, so that TOML values get the same check)."""
    def parse(text):
        if text not in options:
            raise argparse.ArgumentTypeError(f"expected one of {', '.join(repr(o) for o in options)}, got {text!r}")
        return text
    return parse
