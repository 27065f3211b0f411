"""Chat templates rendered within a time and an output-size bound.

A chat template is code that comes with a model folder. transformers renders it in jinja's
immutable sandbox (no attribute of Python's internals, no mutation), which stops escapes but
not a template that loops for hours (nested loops of 100,000) or writes gigabytes
(``'x' * 10**10``). :func:`bounded_template` recompiles transformers' own template (same
extensions, filters and globals: the same text out) in an environment that checks, before
each operation that can grow without bound, that the result stays under ``MAX_OUTPUT_CHARS``
(string and list repetition, concatenation, calls and filters given a size above it), checks
the running output's size and the time at every piece written and every call, and on the main
thread also arms a timer (a loop that neither calls nor writes anything is stopped too). A
refusal is a ``TemplateLimit``, which the adapter reports in one line naming the file.
"""
from __future__ import annotations

import functools
import signal
import threading
import time
from typing import Any, Iterator

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

#: largest prompt a chat template may write (a real one writes a few thousand characters)
MAX_OUTPUT_CHARS = 1 << 24
#: longest a chat template may take to render once (a real one takes milliseconds)
MAX_SECONDS = 10.0

_state = threading.local()


class TemplateLimit(jinja2.exceptions.SecurityError):
    """A chat template went past the output or time bound."""


def _start() -> bool:
    """Start the clock of the outermost render on this thread; True when this call started it."""
    if getattr(_state, "deadline", None) is not None:
        return False
    _state.deadline = time.monotonic() + MAX_SECONDS
    return True


def _check_time() -> None:
    deadline = getattr(_state, "deadline", None)
    if deadline is not None and time.monotonic() > deadline:
        raise TemplateLimit(f"rendering took longer than {MAX_SECONDS:g} s")


def _check_size(size: int) -> None:
    if size > MAX_OUTPUT_CHARS:
        raise TemplateLimit(f"it would write {size} characters, more than {MAX_OUTPUT_CHARS}")


def _sized(value: Any) -> Any:
    if isinstance(value, (str, bytes, list, tuple)):
        _check_size(len(value))
    return value


def _check_arguments(args: tuple, kwargs: dict) -> None:
    """A call given a count above the bound (``'x'.ljust(10**10)``, ``center(10**10)``) is refused
    before it allocates."""
    for value in (*args, *kwargs.values()):
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_OUTPUT_CHARS:
            _check_size(abs(value))


def _alarm(signum: int, frame: Any) -> None:
    raise TemplateLimit(f"rendering took longer than {MAX_SECONDS:g} s")


class _Timer:
    """The main thread's SIGALRM timer for one render, armed only when nobody else uses it."""

    def __enter__(self) -> "_Timer":
        self.armed = (threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer")
                      and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
                      and signal.getsignal(signal.SIGALRM) in (signal.SIG_DFL, None))
        if self.armed:
            signal.signal(signal.SIGALRM, _alarm)
            signal.setitimer(signal.ITIMER_REAL, MAX_SECONDS)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.armed:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, signal.SIG_DFL)


class BoundedTemplate(jinja2.Template):
    """A template whose rendering is checked piece by piece (module docstring)."""

    def generate(self, *args: Any, **kwargs: Any) -> Iterator[str]:
        outermost = _start()
        try:
            with _Timer() if outermost else _NoTimer():
                written = 0
                for piece in super().generate(*args, **kwargs):
                    written += len(piece)
                    _check_size(written)
                    _check_time()
                    yield piece
        finally:
            if outermost:
                _state.deadline = None

    def render(self, *args: Any, **kwargs: Any) -> str:
        return "".join(self.generate(*args, **kwargs))


class _NoTimer:
    def __enter__(self) -> "_NoTimer":
        return self

    def __exit__(self, *exc: Any) -> None:
        pass


class BoundedEnvironment(ImmutableSandboxedEnvironment):
    """transformers' sandbox with the operations that can grow without bound checked first."""

    template_class = BoundedTemplate
    #: compiled into calls of ``call_binop`` (decided when the template compiles)
    intercepted_binops = frozenset({"*", "**", "+"})

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        _check_time()
        if operator == "*":
            for seq, count in ((left, right), (right, left)):
                if isinstance(seq, (str, bytes, list, tuple)) and isinstance(count, int):
                    _check_size(len(seq) * max(count, 0))
        if operator == "**" and isinstance(left, int) and isinstance(right, int) and right > 0:
            _check_size(max(abs(left), 1).bit_length() * right // 8)      # digits of the power, roughly
        return _sized(super().call_binop(context, operator, left, right))

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805 (jinja's signature)
        _check_time()
        _check_arguments(args, kwargs)
        return _sized(super().call(__context, __obj, *args, **kwargs))


def _bounded_filter(function: Any) -> Any:
    @functools.wraps(function)        # keeps jinja's pass_context / pass_environment marks
    def bounded(*args: Any, **kwargs: Any) -> Any:
        _check_time()
        _check_arguments(args[1:], kwargs)
        return _sized(function(*args, **kwargs))
    return bounded


def bounded_template(template: jinja2.Template, source: str) -> jinja2.Template:
    """``source`` compiled like ``template`` (a chat template transformers compiled: its options,
    extensions, filters and globals) in a :class:`BoundedEnvironment`. ``source`` itself must not
    go through transformers' environment: jinja folds constants when compiling, so an unchecked
    compile of ``'x' * 10**10`` would already allocate it."""
    env = template.environment
    bounded = BoundedEnvironment(trim_blocks=env.trim_blocks, lstrip_blocks=env.lstrip_blocks,
                                 keep_trailing_newline=env.keep_trailing_newline,
                                 extensions=[type(ext) for ext in env.extensions.values()])
    bounded.filters.update({name: _bounded_filter(f) for name, f in env.filters.items()})
    bounded.globals.update(env.globals)
    return bounded.from_string(source)
