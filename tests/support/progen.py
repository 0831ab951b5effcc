"""A seeded generator of random C and C++ programs, for testing call-stack reconstruction.

``generate(seed)`` returns a :class:`Program`: 5–40 functions ``long fK(long x)`` with a
random call graph (self recursion, mutual recursion cycles of 2–4 functions, calls through a
function-pointer table, loops calling the same function, leaves, ``return f(x - 1)`` shapes
that become tail calls at -O2, static and extern functions), and, for some seeds,
``setjmp``/``longjmp`` out of deep recursion (some to the oldest armed activation rather
than the nearest, through a guard that recursion arms again at the same call site), C++
exceptions thrown through mutual recursion (C++ programs) or a signal handler that runs
recursive functions and is re-entered by signals raised inside it (in some, the handler
leaves by ``siglongjmp`` to a ``sigsetjmp`` guard armed inside the recursion).
``Program.source()`` writes the program; the same seed always gives the same program, and
the program's behaviour is deterministic (no time, no addresses), so several builds of it
(instrumented, plain, ``-pg``) make the same calls.

Every function takes a depth budget ``x`` and calls with less, and a global call counter
stops all work after ``call_limit`` calls, so programs end quickly whatever their graph.

The program model is a list of statements per function so that a failing program can be
minimised (:meth:`Program.without`): removing a statement or a function (with every
statement that names it) always leaves a valid program.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass, field
from typing import Literal

StmtKind = Literal[
    "call",
    "loop",
    "cond",
    "fptr",
    "work",
    "longjmp",
    "throw",
    "raise",
    "guard",
    "jump_oldest",
    "sigguard",
]


@dataclass(frozen=True)
class Stmt:
    """One statement of a function body.

    ``call``: ``acc += fT(x - d)``; ``loop``: ``count`` calls of fT in a loop; ``cond``: a
    call of fT when ``acc`` is odd; ``fptr``: a call through the function table; ``work``:
    straight-line arithmetic; ``longjmp``/``throw``/``raise``: leave through the armed
    ``setjmp``/``try`` or raise the signal, every ``period``-th time they run; ``guard``:
    call fT inside ``setjmp`` (C) or ``try`` (C++), catching what ``longjmp``/``throw``
    statements further down send; ``jump_oldest``: ``longjmp`` to the outermost armed guard
    (not the nearest); ``sigguard``: call fT inside ``sigsetjmp``, where a signal handler
    may ``siglongjmp`` back to.
    """

    kind: StmtKind
    target: int = -1
    count: int = 1
    delta: int = 1
    period: int = 3

    def targets(self) -> tuple[int, ...]:
        return (self.target,) if self.target >= 0 else ()


@dataclass(frozen=True)
class Function:
    index: int
    static: bool
    body: tuple[Stmt, ...]
    tail: int = -1
    """``return fT(x - 1)`` at the end when >= 0 (a tail call at -O2)."""
    inline_ok: bool = False
    """May the compiler inline it (plain builds only; instrumented builds never inline)."""

    @property
    def name(self) -> str:
        return f"f{self.index}"


@dataclass(frozen=True)
class Program:
    seed: int
    language: Literal["c", "c++"]
    functions: tuple[Function, ...]
    table: tuple[int, ...]
    """Function indices of the function-pointer table (may be empty)."""
    roots: tuple[int, ...]
    """Functions main calls, in order."""
    budget: int
    call_limit: int
    signal_roots: tuple[int, ...] = ()
    """Functions the signal handler calls; non-empty = the program has a handler."""
    handler_escapes: int = 0
    """> 0: every that-many-th run of the handler leaves by ``siglongjmp`` to the nearest
    ``sigguard`` (when one is armed)."""
    static_link: bool = True
    features: tuple[str, ...] = field(default=())

    # ------------------------------------------------------------------ queries

    @property
    def function_names(self) -> tuple[str, ...]:
        """Every function of the program's own code (what oracles compare)."""
        names = [f.name for f in self.functions] + ["main"]
        if self.signal_roots:
            names.append("on_signal")
        return tuple(names)

    @property
    def has_longjmp(self) -> bool:
        """Does the program leave frames by a jump (longjmp or siglongjmp)?"""
        return self._uses("longjmp") or self._uses("jump_oldest") or self._uses("sigguard")

    @property
    def has_throw(self) -> bool:
        return self._uses("throw")

    def _uses(self, kind: str) -> bool:
        return any(s.kind == kind for f in self.functions for s in f.body)

    def size(self) -> int:
        """Statements + functions (what minimisation reduces)."""
        return len(self.functions) + sum(len(f.body) + (f.tail >= 0) for f in self.functions)

    # ------------------------------------------------------------ minimisation

    def without_function(self, index: int) -> Program:
        """The program without function ``index`` and every use of it."""
        funcs = []
        for f in self.functions:
            if f.index == index:
                continue
            body = tuple(s for s in f.body if index not in s.targets())
            funcs.append(dataclasses.replace(f, body=body, tail=-1 if f.tail == index else f.tail))
        return dataclasses.replace(
            self,
            functions=tuple(funcs),
            table=tuple(t for t in self.table if t != index),
            roots=tuple(r for r in self.roots if r != index),
            signal_roots=tuple(r for r in self.signal_roots if r != index),
        )

    def without_stmt(self, function: int, position: int) -> Program:
        """The program without one statement (``position == len(body)``: the tail call)."""
        funcs = []
        for f in self.functions:
            if f.index == function:
                if position == len(f.body):
                    f = dataclasses.replace(f, tail=-1)
                else:
                    f = dataclasses.replace(f, body=f.body[:position] + f.body[position + 1 :])
            funcs.append(f)
        return dataclasses.replace(self, functions=tuple(funcs))

    def smaller(self) -> list[Program]:
        """Every program one step smaller (functions first: they shrink fastest)."""
        out = [self.without_function(f.index) for f in self.functions if len(self.functions) > 1]
        for f in self.functions:
            for k in range(len(f.body) + (f.tail >= 0)):
                out.append(self.without_stmt(f.index, k))
        if self.signal_roots:
            out.append(dataclasses.replace(self, signal_roots=()))
        if self.handler_escapes:
            out.append(dataclasses.replace(self, handler_escapes=0))
        return out

    # ------------------------------------------------------------------ source

    def source(self, *, inline: bool = False) -> str:
        """The program's text. ``inline``: functions marked ``inline_ok`` may be inlined
        (plain builds); otherwise every function is ``noinline, noclone`` (instrumented
        builds: an inlined function still calls the hooks but makes no call)."""
        cxx = self.language == "c++"
        out: list[str] = [f"/* ptscope generated program, seed {self.seed} */"]
        if cxx:
            out += ["#include <cstdio>", "#include <csignal>"]
        else:
            out += ["#include <stdio.h>", "#include <signal.h>", "#include <setjmp.h>"]
        out += [
            "#define NI __attribute__((noinline, noclone))",
            "static volatile long sink;",
            "static long calls;",
            "static long events;",
        ]
        escapes = self._uses("longjmp") or self.has_throw or self._uses("guard")
        if escapes and cxx:
            out += ["struct Boom { long v; };", "static int armed;"]
        elif escapes:
            out.append("static jmp_buf *armed;")
        if self._uses("jump_oldest"):
            out.append("static jmp_buf *oldest;")
        if self._uses("sigguard"):
            out += ["static sigjmp_buf *sig_armed;", "static long sig_events;"]
        if self.signal_roots:
            out.append("static int handler_depth;")
        if cxx:
            out.append('extern "C" {')
        for f in self.functions:
            out.append(f"{self._attrs(f, inline)}long {f.name}(long x);")
        if self.table:
            entries = ", ".join(f"f{t}" for t in self.table)
            out.append(f"static long (*const table[{len(self.table)}])(long) = {{{entries}}};")
        if self.signal_roots:
            out.append("static void on_signal(int sig);")
        for f in self.functions:
            out += self._function(f, inline)
        if self.signal_roots:
            out += self._handler()
        if cxx:
            out.append("}")
        out += self._main()
        return "\n".join(out) + "\n"

    def _attrs(self, f: Function, inline: bool) -> str:
        attrs = "" if inline and f.inline_ok else "NI "
        return ("static " if f.static else "") + attrs

    def _function(self, f: Function, inline: bool) -> list[str]:
        jumps = any(s.kind in ("guard", "sigguard") for s in f.body) and self.language != "c++"
        acc = "volatile long acc" if jumps else "long acc"
        lines = [
            f"{self._attrs(f, inline)}long {f.name}(long x) {{",
            f"\t{acc} = x * 2 + {f.index};",
            f"\tif (x <= 0 || ++calls > {self.call_limit}) {{ sink += acc; return acc; }}",
        ]
        for s in f.body:
            lines += ["\t" + line for line in self._stmt(s)]
        if f.tail >= 0:
            lines.append(f"\tsink += acc;\n\treturn f{f.tail}(x - 1);")
        else:
            lines.append("\treturn acc;")
        lines.append("}")
        return lines

    def _stmt(self, s: Stmt) -> list[str]:
        t = f"f{s.target}"
        if s.kind == "call":
            return [f"acc += {t}(x - {s.delta});"]
        if s.kind == "loop":
            return [f"for (long i = 0; i < {s.count}; i++) acc += {t}(x - {s.delta});"]
        if s.kind == "cond":
            return [f"if (acc & 1) acc += {t}(x - {s.delta});"]
        if s.kind == "fptr":
            n = len(self.table)
            if not n:
                return []
            return [f"acc += table[(unsigned long)(acc + x) % {n}](x - {s.delta});"]
        if s.kind == "work":
            return [f"acc = acc * {s.count * 2 + 3} + sink;"]
        if s.kind == "longjmp":
            return [f"if (armed && ++events % {s.period} == 0) longjmp(*armed, 1);"]
        if s.kind == "throw":
            return [f"if (armed && ++events % {s.period} == 0) throw Boom{{x}};"]
        if s.kind == "raise":
            if not self.signal_roots:
                return []
            return [f"if (handler_depth < 3 && ++events % {s.period} == 0) raise(SIGUSR1);"]
        if s.kind == "jump_oldest":
            return [f"if (oldest && ++events % {s.period} == 0) longjmp(*oldest, 1);"]
        if s.kind == "sigguard":
            return [
                "{",
                "\tsigjmp_buf here, *outer = sig_armed;",
                "\tint depth = handler_depth;",
                f"\tif (!sigsetjmp(here, 1)) {{ sig_armed = &here; acc += {t}(x - {s.delta}); }}",
                "\telse { acc += 5; handler_depth = depth; }",
                "\tsig_armed = outer;",
                "}",
            ]
        if s.kind == "guard":
            if self.language == "c++":
                return [
                    "armed++;",
                    f"try {{ acc += {t}(x - {s.delta}); }} catch (const Boom &b) {{ acc += b.v; }}",
                    "armed--;",
                ]
            oldest = self._uses("jump_oldest")
            arm = "armed = &here; if (!oldest) oldest = &here;" if oldest else "armed = &here;"
            return [
                "{",
                "\tjmp_buf here, *outer = armed;",
                f"\tif (!setjmp(here)) {{ {arm} acc += {t}(x - {s.delta}); }}",
                "\telse acc += 7;",
                "\tarmed = outer;",
                *(["\tif (oldest == &here) oldest = 0;"] if oldest else []),
                "}",
            ]
        raise AssertionError(s.kind)

    def _handler(self) -> list[str]:
        lines = ["static void on_signal(int sig) {", "\thandler_depth++;"]
        for r in self.signal_roots:
            lines.append(f"\tsink += f{r}({max(2, self.budget // 2)} + sig % 2);")
        if self.handler_escapes and self._uses("sigguard"):
            lines.append(
                f"\tif (sig_armed && ++sig_events % {self.handler_escapes} == 0)"
                " siglongjmp(*sig_armed, 1);"
            )
        lines += ["\thandler_depth--;", "}"]
        return lines

    def _main(self) -> list[str]:
        lines = ["int main(int argc, char **argv) {", "\t(void)argv;", "\tlong r = 0;"]
        if self.signal_roots:
            lines += [
                "\tstruct sigaction sa = {0};",
                "\tsa.sa_handler = on_signal;",
                "\tsa.sa_flags = SA_NODEFER;  /* a handler may be re-entered: it recurses */",
                "\tsigaction(SIGUSR1, &sa, 0);",
            ]
        for r in self.roots:
            lines.append(f"\tr += f{r}({self.budget} + argc - 1);")
        lines += ['\tprintf("%ld %ld\\n", r, (long)sink);', "\treturn 0;", "}"]
        return lines


# ---------------------------------------------------------------------- generation


def generate(seed: int) -> Program:
    """The program of ``seed`` (deterministic)."""
    rng = random.Random(seed)
    n = rng.randint(5, 40)
    roll = rng.random()
    feature = "plain"
    if roll < 0.2:
        feature = "longjmp"
    elif roll < 0.4:
        feature = "exceptions"
    elif roll < 0.55:
        feature = "signals"
    language: Literal["c", "c++"] = "c++" if feature == "exceptions" else "c"
    # Calls from each function: a random graph, plus cycles.
    edges: dict[int, list[int]] = {k: [] for k in range(n)}
    leaves = set(rng.sample(range(n), k=max(1, n // 5)))
    callers = [k for k in range(n) if k not in leaves]
    for k in callers:
        for _ in range(rng.randint(1, 3)):
            edges[k].append(rng.randrange(n))
    # Self recursion and mutual recursion cycles of 2-4 functions.
    for k in rng.sample(callers, k=min(len(callers), rng.randint(1, 3))):
        edges[k].append(k)
    for _ in range(rng.randint(1, 3)):
        size = rng.randint(2, 4)
        if len(callers) < size:
            break
        cycle = rng.sample(callers, k=size)
        for a, b in zip(cycle, cycle[1:] + cycle[:1], strict=True):
            edges[a].append(b)
    table = tuple(rng.sample(range(n), k=rng.randint(0, min(6, n))))
    functions = []
    for k in range(n):
        body: list[Stmt] = []
        for t in edges[k]:
            kind = rng.choices(["call", "loop", "cond"], weights=[6, 2, 2])[0]
            count = rng.randint(2, 4) if kind == "loop" else 1
            body.append(Stmt(kind, t, count=count, delta=rng.randint(1, 2)))
        if table and k not in leaves and rng.random() < 0.3:
            body.append(Stmt("fptr", delta=rng.randint(1, 2)))
        if rng.random() < 0.5:
            body.insert(rng.randint(0, len(body)), Stmt("work", count=rng.randint(0, 5)))
        rng.shuffle(body)
        tail = -1
        if k not in leaves and rng.random() < 0.3:
            tail = rng.randrange(n)
        functions.append(
            Function(
                k,
                static=rng.random() < 0.4,
                body=tuple(body),
                tail=tail,
                inline_ok=rng.random() < 0.2,
            )
        )
    signal_roots: tuple[int, ...] = ()
    if feature in ("longjmp", "exceptions", "signals"):
        functions = _add_escapes(rng, functions, feature)
        if feature == "signals":
            signal_roots = tuple(rng.sample(range(n), k=rng.randint(1, 2)))
    roots = tuple(rng.sample(range(n), k=min(n, rng.randint(1, 4))))
    # The hard corners come from a generator of their own, so that adding them left every
    # other seed's program as it was.
    hard = random.Random(f"hard-{seed}")
    functions, handler_escapes = _add_hard_corners(hard, functions, feature)
    return Program(
        seed=seed,
        language=language,
        functions=tuple(functions),
        table=table,
        roots=roots,
        budget=rng.randint(4, 9),
        call_limit=rng.choice([200, 500, 1000]),
        signal_roots=signal_roots,
        handler_escapes=handler_escapes,
        # C++ dynamic programs spend ~1 M instructions loading libstdc++ before main: too
        # slow under QEMU for a fuzzer (the corpus has a dynamic exceptions program).
        static_link=language == "c++" or rng.random() < 0.75,
        features=(feature,),
    )


def _add_escapes(rng: random.Random, functions: list[Function], feature: str) -> list[Function]:
    """Guards (setjmp / try) in some functions, and the statements that escape to them
    (longjmp / throw) or raise the signal, in others."""
    n = len(functions)
    out = list(functions)
    if feature in ("longjmp", "exceptions"):
        for k in rng.sample(range(n), k=rng.randint(1, max(1, n // 4))):
            f = out[k]
            guard = Stmt("guard", rng.randrange(n), delta=1)
            out[k] = dataclasses.replace(f, body=(*f.body, guard))
    kind: StmtKind = {"longjmp": "longjmp", "exceptions": "throw", "signals": "raise"}[feature]  # type: ignore[assignment]
    for k in rng.sample(range(n), k=rng.randint(1, max(1, n // 3))):
        f = out[k]
        body = list(f.body)
        body.insert(rng.randint(0, len(body)), Stmt(kind, period=rng.randint(2, 7)))
        out[k] = dataclasses.replace(f, body=tuple(body))
    return out


def _add_hard_corners(
    rng: random.Random, functions: list[Function], feature: str
) -> tuple[list[Function], int]:
    """For half the longjmp programs: a guard in a function around a call of itself (so that
    recursion arms it again at the same call site) and ``jump_oldest`` statements that leave
    to the outermost armed guard. For half the signal programs: ``sigguard`` statements (one
    around a call of its own function) and a handler that leaves by ``siglongjmp``. Returns
    the functions and the handler's escape period (0: none)."""
    n = len(functions)
    out = list(functions)
    if feature not in ("longjmp", "signals") or rng.random() < 0.5:
        return out, 0

    def add(k: int, stmt: Stmt) -> None:
        body = list(out[k].body)
        body.insert(rng.randint(0, len(body)), stmt)
        out[k] = dataclasses.replace(out[k], body=tuple(body))

    k = rng.randrange(n)
    if feature == "longjmp":
        add(k, Stmt("guard", k, delta=1))
        for j in {k, rng.randrange(n)}:
            add(j, Stmt("jump_oldest", period=rng.randint(2, 5)))
        return out, 0
    add(k, Stmt("sigguard", k, delta=1))
    add(rng.randrange(n), Stmt("sigguard", rng.randrange(n), delta=1))
    return out, rng.randint(1, 3)
