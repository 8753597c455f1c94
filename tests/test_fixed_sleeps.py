"""No test waits a fixed time for something to happen (pure: reads tests/ with ``ast``).

A test that sleeps 0.3 s "so that the process has seen the exit" guesses how long that
takes; on a loaded machine the guess is wrong and the test fails for no fault of the code
(issue 29). It waits on the condition instead, with a deadline (``proc_helpers.wait_until``).

So every ``time.sleep`` / awaited ``asyncio.sleep`` in tests/ (in its child programs, and
in the Python source a test hands to a child as a string) is one of:
- a turn of a polling loop: a ``while`` with a condition, or a loop that ``break``s,
  ``return``s or raises out of its own body;
- ``sleep(0)``, a yield to the loop, not a wait;
- a sleep whose fixed time is the point (an endpoint's work, a window in which nothing
  may happen, pacing, a child that lives until it is killed), saying so in a
  ``# sleep: <why>`` comment on its line or in the comment lines just above it.
"""

from __future__ import annotations

import ast
import pathlib
import textwrap

TESTS = pathlib.Path(__file__).resolve().parent
MARK = "# sleep:"


def _is_sleep(call: ast.Call, awaited: bool) -> bool:
    f = call.func
    if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.attr == "sleep":
        return f.value.id == "time" or (f.value.id == "asyncio" and awaited)
    return isinstance(f, ast.Name) and f.id == "sleep"


def _leaves(loop: ast.AST) -> bool:
    """Does the loop's own body break, return or raise (a nested loop's break is its own)?"""
    todo = list(loop.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Return, ast.Raise, ast.Break)):
            return True
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue
        if isinstance(node, (ast.For, ast.AsyncFor, ast.While)):
            todo += [n for n in ast.walk(node) if isinstance(n, (ast.Return, ast.Raise))]
            continue
        todo += list(ast.iter_child_nodes(node))
    return False


def _polls(node: ast.AST, parents: dict) -> bool:
    """Is ``node`` inside a polling loop of its own function?"""
    while node in parents:
        node = parents[node]
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            return False
        if isinstance(node, ast.While) and not (isinstance(node.test, ast.Constant)
                                                and node.test.value):
            return True
        if isinstance(node, (ast.For, ast.AsyncFor, ast.While)) and _leaves(node):
            return True
    return False


def _embedded(node: ast.AST) -> str | None:
    """The text of a string literal (an f-string's fields as ``_``), if it may be code."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        text = node.value
    elif isinstance(node, ast.JoinedStr):
        text = "".join(v.value if isinstance(v, ast.Constant) else "_" for v in node.values)
    else:
        return None
    return text if "sleep(" in text else None


def _says_why(lines: list[str], n: int) -> bool:
    """Is there a ``# sleep:`` comment on line ``n`` (1-based) or in the comment lines
    right above it?"""
    if MARK in lines[n - 1]:
        return True
    for line in reversed(lines[:n - 1]):
        if not line.lstrip().startswith("#"):
            return False
        if MARK in line:
            return True
    return False


def fixed_sleeps(source: str, name: str, outer: list[str] | None = None,
                 offset: int = 0) -> list[str]:
    """``name:line: code`` of each sleep in ``source`` that is not allowed (see above).
    ``outer``/``offset``: the lines of the file a string of code sits in, and where."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []           # a string that is not code
    lines = source.splitlines()
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    found = []
    for node in ast.walk(tree):
        if outer is None and (text := _embedded(node)) is not None \
                and not isinstance(parents.get(node), ast.JoinedStr):
            found += fixed_sleeps(textwrap.dedent(text), name, lines, node.lineno - 1)
        if not isinstance(node, ast.Call) or not _is_sleep(
                node, isinstance(parents.get(node), ast.Await)):
            continue
        if node.args and isinstance(node.args[0], ast.Constant) and node.args[0].value == 0:
            continue
        if _polls(node, parents):
            continue
        n = node.lineno
        if _says_why(lines, n) or (outer is not None and _says_why(outer, offset + n)):
            continue
        found.append(f"{name}:{offset + n}: {lines[n - 1].strip()}")
    return found


def test_no_test_waits_a_fixed_time_for_a_condition():
    files = sorted(TESTS.glob("*.py")) + sorted(TESTS.glob("monarch_programs/*.py"))
    files.remove(pathlib.Path(__file__).resolve())      # its cases below are fixed sleeps
    found = [hit for path in files
             for hit in fixed_sleeps(path.read_text(), str(path.relative_to(TESTS)))]
    assert not found, (
        f"{len(found)} fixed sleep(s): wait on the condition instead "
        f"(proc_helpers.wait_until), or say why the fixed time is the point in a "
        f"'{MARK} ...' comment on the line or just above it:\n" + "\n".join(found))


def test_what_counts_as_a_fixed_sleep():
    """The checker itself: each case is one sleep, found (True) or let pass."""
    cases = {
        "time.sleep(0.3)\nassert done()": True,
        "async def f():\n    await asyncio.sleep(0.2)": True,
        "from time import sleep\nsleep(1)": True,
        "for step in (1, 2):\n    time.sleep(0.5)\n    assert not done()": True,
        "while True:\n    time.sleep(1)": True,
        "while True:\n    for x in xs:\n        break\n    time.sleep(1)": True,
        "while not done():\n    time.sleep(0.05)": False,
        "for _ in range(50):\n    if done():\n        break\n    time.sleep(0.1)": False,
        "while True:\n    if time.monotonic() > t:\n        raise E\n    time.sleep(0.1)": False,
        "time.sleep(0)\nawait asyncio.sleep(0)": False,
        "time.sleep(600)  # sleep: lives until killed": False,
        "# sleep: the window measured\ntime.sleep(4)": False,
        "# sleep: a window in which\n# nothing may happen\ntime.sleep(1)": False,
        "# sleep: said of another line\nx = 1\ntime.sleep(1)": True,
        "tg.create_task(asyncio.sleep(0.01))": False,      # not a wait of this code
        "x.sleep.call_one(60)": False,
        # code handed to a child, as a string and as an f-string
        's = """\nimport time\ntime.sleep(0.5)\n"""': True,
        's = f"""\n    time.sleep({t})\n    print({t})\n"""': True,
        's = """\n    time.sleep(600)     # sleep: until killed\n"""': False,
        '# sleep: lives until killed\nrun(["python", "-c", "import time; time.sleep(60)"])':
            False,
    }
    got = {src: bool(fixed_sleeps(src, "t")) for src in cases}
    assert got == cases
    # the line given is the file's, also inside a string of code
    assert fixed_sleeps('x = 1\ns = """\nimport time\ntime.sleep(1)\n"""', "f.py") == \
        ["f.py:4: time.sleep(1)"]
