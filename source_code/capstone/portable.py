"""Running a function written in a notebook cell in fresh processes (notebook 19's check).

A function defined in a notebook cell cannot be pickled (its module is "__main__"), so
``portable(fn)`` takes its source and what its code names from the notebook's globals, and
``rebuild`` executes that source in the fresh process: modules and importable objects by name,
plain values (numbers, strings, None, and tuples, lists, sets and dicts of them: anything that
pickles without naming "__main__"), functools.partial objects of such functions, and the
notebook's own helper functions by their source.
"""
from __future__ import annotations

import functools
import importlib
import inspect
import pickle
import textwrap


def _source(fn) -> str:
    try:
        return textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError):
        raise ValueError(f"cannot read the source of {getattr(fn, '__name__', fn)!r}: define it "
                         "with `def` in a notebook cell or a .py file") from None


def portable(fn) -> tuple[str, str, dict]:
    """(source, name, {global name: ("module", m) | ("attr", m, qualname) | ("value", v) |
    ("source", helper's source) | ("partial", helper, args, keywords)}) of ``fn``: what a fresh
    process needs to rebuild it (the modules, importable objects, plain values, partials and
    helper functions its code names)."""
    source, found, todo = _source(fn), {}, [fn]
    while todo:
        f = todo.pop()
        codes, names = [f.__code__], set()
        while codes:
            code = codes.pop()
            names.update(code.co_names)
            codes += [c for c in code.co_consts if inspect.iscode(c)]
        for name in (names & set(f.__globals__)) - set(found):
            value = f.__globals__[name]
            if inspect.ismodule(value):
                found[name] = ("module", value.__name__)
            elif getattr(value, "__module__", "__main__") not in ("__main__", None) and hasattr(value, "__qualname__"):
                found[name] = ("attr", value.__module__, value.__qualname__)
            elif inspect.isfunction(value) and value is not fn:      # a helper of the notebook
                found[name] = ("source", _source(value))
                todo.append(value)
            elif isinstance(value, functools.partial) and inspect.isfunction(value.func) \
                    and _plain((value.args, value.keywords)):        # partial(helper, values)
                helper = value.func.__name__
                found[name] = ("partial", helper, value.args, value.keywords)
                if helper not in found and _plain(value.func):       # importable: by reference
                    found[helper] = ("attr", value.func.__module__, value.func.__qualname__)
                elif helper not in found:
                    found[helper] = ("source", _source(value.func))
                    todo.append(value.func)
            elif _plain(value):                                      # numbers, strings, containers
                found[name] = ("value", value)
    return source, fn.__name__, found


def _plain(value) -> bool:
    """Can a fresh process rebuild ``value`` from its pickle: nothing of the notebook's own
    (module "__main__") inside, no handle on this process (a tensor is fine, a group is not)?"""
    try:
        return b"__main__" not in pickle.dumps(value)
    except Exception:                         # not picklable (a lock, a generator, a group)
        return False


def rebuild(source: str, name: str, found: dict):
    """The function ``portable`` described, made in this process."""
    namespace = {}
    for key, what in found.items():
        if what[0] in ("module", "attr"):
            obj = importlib.import_module(what[1])
            for part in (what[2].split(".") if what[0] == "attr" else ()):
                obj = getattr(obj, part)
            namespace[key] = obj
        elif what[0] == "value":
            namespace[key] = what[1]
    for key, what in found.items():
        if what[0] == "source":
            exec(compile(what[1], f"<{key}>", "exec"), namespace)
    for key, what in found.items():
        if what[0] == "partial":
            namespace[key] = functools.partial(namespace[what[1]], *what[2], **what[3])
    exec(compile(source, f"<{name}>", "exec"), namespace)
    return namespace[name]


def reaches(fn, found: dict, modules: tuple[str, ...]) -> list[str]:
    """The names through which ``fn`` (``found``: ``portable(fn)``'s third item) reaches one of
    ``modules`` (dotted prefixes): ``fn`` itself defined there, a global that is such a module or
    one of its objects, or an import of one, in ``fn``'s own code or in a notebook helper it calls."""
    hit = {name for name, what in found.items()
           if what[0] in ("module", "attr") and what[1].startswith(modules)}
    if getattr(fn, "__module__", "").startswith(modules):
        hit.add(fn.__name__)
    last = {m.rsplit(".", 1)[-1] for m in modules}
    todo, done = [fn], set()
    while todo:
        f = todo.pop()
        done.add(f)
        codes = [f.__code__]
        while codes:
            code = codes.pop()
            hit.update(n for n in code.co_names if n.startswith(modules) or n in last)
            codes += [c for c in code.co_consts if inspect.iscode(c)]
        todo += [f.__globals__[name] for name, what in found.items()
                 if what[0] == "source" and inspect.isfunction(f.__globals__.get(name))
                 and f.__globals__[name] not in done]
    return sorted(hit)
