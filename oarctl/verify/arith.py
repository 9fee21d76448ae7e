"""A small arithmetic reader for the cheap path: values of short expressions, without the engine.

It reads a strict subset of LaTeX arithmetic: numbers, one-letter variables, `\\pi`, `+ -`,
products (side by side, `\\cdot`, `\\times`), one integer power (`x^2`, `x^{-3}`), `\\sqrt{...}`,
`\\frac{...}{...}`, parentheses and braces. Not read at all, because the engine's reading may
differ from a plain product: functions, subscripts, `\\pm`, `/`, `e` and `i` (constants for the
engine, in some contexts), two letters in a row and a letter at the end (words and units, which
latex2sympy rewrites or drops: `8 hours` = 8, `5 m` = 5, `percent`, `inf`), a number next to a
number (`2 3` = 5) or a fraction (`1\\frac{4}{5}`, a mixed number). Values are floats with a
bound on their rounding error (`scale`), computed at fixed points for the variables. A hand-written
parser of at most MAX_LENGTH characters and small powers: no eval, no sympy, bounded time.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

MAX_LENGTH = 200
MAX_POWER = 10
TOKEN = re.compile(r"\s*(?:(\d+(?:\.\d+)?)|(\\(?:pi|sqrt|frac|cdot|times))(?![A-Za-z])|([A-Za-z])|([-+^(){}]))")
CONSTANT_LETTERS = set("eEiI")  # Euler's number and the imaginary unit for the engine, in some contexts
# Two fixed, unrelated points for the variables: a polynomial that takes two values is not constant.
POINTS = ((0.5772156649, 1.2020569032, 0.9159655942, 1.6180339887, 0.3183098862, 1.4142135624),
          (1.3247179572, 0.6931471806, 1.7320508076, 0.2718281828, 1.0986122887, 0.8660254038))


class Unreadable(Exception):
    pass


@dataclass(frozen=True)
class Value:
    value: float
    scale: float  # a bound on the magnitudes met on the way (sums that cancel, small denominators):
    #               the rounding error is below scale * 1e-14


def _tokens(text: str) -> list[tuple[str, str]]:
    """The tokens, or Unreadable: also for two letters in a row and a letter at the end."""
    tokens, position = [], 0
    while position < len(text):
        match = TOKEN.match(text, position)
        if match is None or match.end() == position:
            if text[position:].strip() == "":
                break
            raise Unreadable(text[position:position + 10])
        number, command, letter, symbol = match.groups()
        if letter in CONSTANT_LETTERS or (letter and tokens and tokens[-1][0] == "letter"):
            raise Unreadable(letter)
        tokens.append(("number", number) if number else ("command", command) if command
                      else ("letter", letter) if letter else ("symbol", symbol))
        position = match.end()
    if tokens and tokens[-1][0] == "letter":
        raise Unreadable("a letter at the end may be a unit")
    return tokens


class _Reader:
    """Recursive descent over the tokens; each method returns a function of the variables' values."""

    def __init__(self, tokens: list[tuple[str, str]]):
        self.tokens, self.position, self.letters = tokens, 0, set()

    def peek(self) -> tuple[str, str] | None:
        return self.tokens[self.position] if self.position < len(self.tokens) else None

    def take(self, kind: str, text: str | None = None) -> str:
        token = self.peek()
        if token is None or token[0] != kind or (text is not None and token[1] != text):
            raise Unreadable(f"expected {text or kind}")
        self.position += 1
        return token[1]

    def expression(self):
        terms = []
        sign = 1.0
        if self.peek() in (("symbol", "-"), ("symbol", "+")):
            sign = -1.0 if self.take("symbol") == "-" else 1.0
        terms.append((sign, self.term()))
        while self.peek() in (("symbol", "-"), ("symbol", "+")):
            sign = -1.0 if self.take("symbol") == "-" else 1.0
            terms.append((sign, self.term()))
        return lambda point: _sum([(s, t(point)) for s, t in terms])

    def term(self):
        factors = [self.power(first=True)]
        while True:
            token = self.peek()
            if token in (("command", "\\cdot"), ("command", "\\times")):
                self.position += 1
                factors.append(self.power(first=True))
            elif token is not None and token not in (("symbol", "-"), ("symbol", "+"), ("symbol", ")"),
                                                    ("symbol", "}")):
                factors.append(self.power(first=False))  # side by side: `2\sqrt{3}`, `\pi r^2`
            else:
                return lambda point: _product([f(point) for f in factors])

    def power(self, first: bool):
        after_number = not first and self.position > 0 and self.tokens[self.position - 1][0] == "number"
        if not first and self.peek() is not None and self.peek()[0] == "number":
            raise Unreadable("a number after a factor")  # `2 3` is 5 for the engine
        if after_number and self.peek() == ("command", "\\frac"):
            raise Unreadable("a mixed number")  # `1\frac{4}{5}` is 9/5 for the engine
        base = self.atom()
        if self.peek() != ("symbol", "^"):
            return base
        self.position += 1
        exponent = self.exponent()
        if self.peek() == ("symbol", "^"):
            raise Unreadable("a power of a power")
        return lambda point: _power(base(point), exponent)

    def exponent(self) -> int:
        if self.peek() == ("symbol", "{"):
            self.position += 1
            negative = self.peek() == ("symbol", "-")
            if negative:
                self.position += 1
            digits = self.take("number")
            self.take("symbol", "}")
        else:
            digits, negative = self.take("number"), False
            if len(digits) != 1:
                raise Unreadable("x^23 is x^2 3 in TeX")
        if not digits.isdigit() or int(digits) > MAX_POWER:
            raise Unreadable("power")
        return -int(digits) if negative else int(digits)

    def atom(self):
        kind, text = self.peek() or ("end", "")
        self.position += 1
        if kind == "number":
            value = float(text)
            return lambda point: Value(value, abs(value))
        if kind == "letter":
            if self.peek() == ("symbol", "("):
                raise Unreadable("f(x) may be a function for the engine")
            self.letters.add(text.lower())  # the engine merges `R` and `r`; harmless here either way
            name = text.lower()
            return lambda point: Value(point[name], abs(point[name]))
        if (kind, text) == ("command", "\\pi"):
            return lambda point: Value(math.pi, math.pi)
        if (kind, text) == ("command", "\\sqrt"):
            inner = self.digits(1) or self.group()  # `\sqrt2` is TeX's `\sqrt{2}`
            return lambda point: _sqrt(inner(point))
        if (kind, text) == ("command", "\\frac"):
            shorthand = self.digits(2)  # `\frac12` is TeX's `\frac{1}{2}`
            numerator, denominator = shorthand or (self.group(), self.group())
            return lambda point: _quotient(numerator(point), denominator(point))
        if (kind, text) in (("symbol", "("), ("symbol", "{")):
            inner = self.expression()
            self.take("symbol", ")" if text == "(" else "}")
            return inner
        raise Unreadable(text)

    def digits(self, count: int):
        """`count` one-digit arguments written as one number token (`\\frac12`), else None; a number
        token of another length is not read (`\\sqrt23` is `\\sqrt{2}3`)."""
        token = self.peek()
        if token is None or token[0] != "number":
            return None
        if len(token[1]) != count or not token[1].isdigit():
            raise Unreadable(token[1])
        self.position += 1
        values = [Value(float(digit), float(digit)) for digit in token[1]]
        constants = [lambda point, value=value: value for value in values]
        return constants[0] if count == 1 else tuple(constants)

    def group(self):
        self.take("symbol", "{")
        inner = self.expression()
        self.take("symbol", "}")
        return inner


def _sum(terms: list[tuple[float, Value]]) -> Value:
    return Value(sum(sign * t.value for sign, t in terms), sum(t.scale for _, t in terms))


def _product(factors: list[Value]) -> Value:
    return Value(math.prod(f.value for f in factors), math.prod(f.scale for f in factors))


def _amplification(inner: Value) -> float:
    """How much a value's relative error may exceed the float rounding (a sum that cancelled);
    a value too close to zero for its scale (`\\sqrt{2}^2-2`) may be zero for the engine: not read."""
    if inner.value == 0 or abs(inner.value) <= inner.scale * 1e-6:
        raise Unreadable("(almost) zero")
    return inner.scale / abs(inner.value)


def _power(base: Value, exponent: int) -> Value:
    value = base.value ** exponent
    if base.value == 0 and exponent > 0:
        return Value(0.0, base.scale ** exponent)
    return Value(value, abs(value) * _amplification(base) ** abs(exponent))


def _sqrt(inner: Value) -> Value:
    if inner.value < 0:
        raise Unreadable("square root of a negative number")
    if inner.value == 0 and inner.scale == 0:
        return Value(0.0, 0.0)
    value = math.sqrt(inner.value)
    return Value(value, value * _amplification(inner))


def _quotient(numerator: Value, denominator: Value) -> Value:
    value = numerator.value / denominator.value if denominator.value else math.inf
    return Value(value, numerator.scale / abs(denominator.value) * _amplification(denominator))


def evaluate(text: str) -> tuple[list[Value], bool] | None:
    """(its value at each point of POINTS, whether it has variables), None when not readable."""
    if len(text) > MAX_LENGTH:
        return None
    try:
        reader = _Reader(_tokens(text))
        function = reader.expression()
        if reader.peek() is not None:
            return None
        letters = sorted(reader.letters)
        if len(letters) > len(POINTS[0]):
            return None
        values = [function(dict(zip(letters, point))) for point in POINTS]
    except (Unreadable, OverflowError, ZeroDivisionError, RecursionError):
        return None
    if not all(math.isfinite(v.value) and math.isfinite(v.scale) for v in values):
        return None
    return values, bool(letters)
