#!/usr/bin/env python3
"""Moves the hint of every TINYDDP_CHECK / TINYDDP_FAIL message into its own argument:

    TINYDDP_CHECK(n > 0, "writing ", path, " failed; hint: check free disk space")
becomes
    TINYDDP_CHECK(n > 0, "writing ", path, " failed", hint("check free disk space"))

and the arguments after the hint go inside hint(...) with it:

    TINYDDP_FAIL("program '", name, "' was not found on PATH; hint: give its path (./", name, ")")
    TINYDDP_FAIL("program '", name, "' was not found on PATH", hint("give its path (./", name, ")"))

Error then holds the hint in a field of its own (core/error.h), and "message; hint: hint" is written
only where the error is printed, so no code has to find "; hint:" in a message to take it apart.

Only a message argument made of string literals alone (adjacent literals included, the marker possibly
split between two of them) is rewritten; a "; hint:" inside an expression (a ternary, a string being
built) is left as it is and listed, to convert by hand. In a file that is neither inside namespace
tinyddp nor `using namespace tinyddp`, the call is written tinyddp::hint(...).

Idempotent: a converted call has no "; hint:" left in its literals, so a second run changes nothing.

usage: scripts/convert_hints.py [--check] [--list-left] [REPOSITORY_ROOT]
  (default)    rewrite the tracked .h/.cpp/.cu files; print how many calls changed in how many files
  --check      change nothing; exit 1 if a call would change
  --list-left  also print every "; hint:" the script leaves alone (outside those two macros, or in an
               expression it does not take apart)
"""
import os
import re
import subprocess
import sys

MACROS = ("TINYDDP_CHECK", "TINYDDP_FAIL")
MARKER = "; hint:"


def skip_string(text, i):
    """text[i] starts a string or char literal (possibly raw); returns the index after it."""
    if text[i] == "R" and text[i + 1] == '"':
        close_paren = text.index("(", i + 2)
        delimiter = text[i + 2:close_paren]
        end = text.index(")" + delimiter + '"', close_paren)
        return end + len(delimiter) + 2
    quote = text[i]
    j = i + 1
    while text[j] != quote:
        j += 2 if text[j] == "\\" else 1
    return j + 1


def skip_literal(text, i):
    """A string or char literal, with its prefix (u8, L, R...), starts at i; returns the index after it."""
    j = i
    while text[j] not in "\"'":
        j += 1
    return skip_string(text, j if text[j - 1] != "R" else j - 1)


def skip_comment(text, i):
    if text.startswith("//", i):
        end = text.find("\n", i)
        return len(text) if end < 0 else end
    return text.index("*/", i + 2) + 2


def string_start(text, i):
    """Whether a (possibly prefixed) string or char literal starts at i; returns the quote's offset or -1."""
    c = text[i]
    if c in "\"'":
        if c == "'" and i > 0 and (text[i - 1].isalnum()):  # a digit separator (1'000'000)
            return -1
        return i
    m = re.match(r'(u8|u|U|L)?R?"', text[i:i + 4])
    if m and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
        return i
    return -1


def split_arguments(text, open_paren):
    """The top-level arguments of the call whose '(' is at open_paren: [(start, end)], and the ')' index."""
    args, depth, start, i = [], 0, open_paren + 1, open_paren + 1
    while True:
        c = text[i]
        if text.startswith("//", i) or text.startswith("/*", i):
            i = skip_comment(text, i)
            continue
        if string_start(text, i) >= 0:
            i = skip_literal(text, i)
            continue
        if c in "([{":
            depth += 1
        elif c in ")]}":
            if depth == 0:
                args.append((start, i))
                return args, i
            depth -= 1
        elif c == "," and depth == 0:
            args.append((start, i))
            start = i + 1
        i += 1


LITERAL = re.compile(r'\s*"((?:[^"\\\n]|\\.)*)"')


def literals_of(arg):
    """[(content_start, content_end)] when `arg` is only plain string literals and blanks, else None."""
    spans, i = [], 0
    while True:
        m = LITERAL.match(arg, i)
        if not m:
            break
        spans.append((m.start(1), m.end(1)))
        i = m.end()
    return spans if spans and arg[i:].strip() == "" else None


def convert_argument(arg, spans):
    """Splits a literals-only argument at its hint: (message part, hint part) as source, or None."""
    joined, owner = "", []
    for k, (s, e) in enumerate(spans):
        joined += arg[s:e]
        owner += [(k, s + off) for off in range(e - s)]
    at = joined.find(MARKER)
    if at < 0:
        return None
    end = at + len(MARKER)
    if end < len(joined) and joined[end] == " ":
        end += 1
    # The message: the literals before the marker's, and the marker's up to the marker.
    first_k, first_pos = owner[at]
    if first_pos > spans[first_k][0]:
        message = arg[:first_pos] + '"'
    else:
        message = arg[:spans[first_k][0] - 1]  # the marker opens its literal: none of it is message
    # The hint: from just after the marker to the argument's end.
    rest = ""
    if end < len(joined):
        last_k, last_pos = owner[end]
        rest = arg[spans[last_k][0] - 1:] if last_pos == spans[last_k][0] else '"' + arg[last_pos:]
    return message.strip(), rest.strip()


def convert_call(text, name_at, open_paren, qualifier):
    """The rewritten source of one call, or None when it has no hint in a form this script takes apart."""
    args, close = split_arguments(text, open_paren)
    first_message = 1 if text.startswith("TINYDDP_CHECK", name_at) else 0
    for index in range(first_message, len(args)):
        s, e = args[index]
        arg = text[s:e]
        choice = TERNARY.match(arg)
        if choice and index == len(args) - 1:
            # cond ? "; hint: A" : "; hint: B" as the last argument: hint(cond ? "A" : "B").
            leading, condition, first, _, second = choice.groups()
            new_arg = f'{leading}{qualifier}hint({condition}? "{first}"{choice.group("gap")}: "{second}")'
            return text[:s] + new_arg + text[close:], s + len(new_arg)
        spans = literals_of(arg)
        if spans is None:
            continue
        parts = convert_argument(arg, spans)
        if parts is None:
            continue
        message, hint_start = parts
        after = text[e:close]  # ", more, args" or ""
        tail = [hint_start] if hint_start else []
        if after.strip():
            rest = after[1:]  # without its comma
            tail.append(rest.strip() if not hint_start else rest)
        if not tail:
            return None  # "...; hint:" with nothing after it: leave it for a person to look at
        hint_call = qualifier + "hint(" + (tail[0] if len(tail) == 1 else tail[0] + "," + tail[1]) + ")"
        leading = arg[:len(arg) - len(arg.lstrip())]
        if message:
            new_arg = leading + message + ", " + hint_call
        else:
            new_arg = leading + hint_call
        return text[:s] + new_arg + text[close:], s + len(new_arg)
    return None


TERNARY = re.compile(r'(\s*)([^?"]+)\?\s*"; hint: ((?:[^"\\\n]|\\.)*)"(?P<gap>\s*):\s*"; hint: ((?:[^"\\\n]|\\.)*)"\s*$')
CALL = re.compile(r"\b(TINYDDP_CHECK|TINYDDP_FAIL)\s*\(")


def convert_text(text, qualifier):
    """(new text, calls converted, [offsets of calls with a hint left alone]). Calls are looked for in
    code only: not in comments, string literals or preprocessor lines (the macros' own #define)."""
    converted, left, i = 0, [], 0
    while i < len(text):
        if text.startswith("//", i) or text.startswith("/*", i):
            i = skip_comment(text, i)
            continue
        if text[i] == "#" and text[text.rfind("\n", 0, i) + 1:i].strip() == "":
            while True:  # a preprocessor line, with its continuations
                end = text.find("\n", i)
                if end < 0 or text[end - 1] != "\\":
                    break
                i = end + 1
            i = len(text) if end < 0 else end
            continue
        if string_start(text, i) >= 0:
            i = skip_literal(text, i)
            continue
        m = CALL.match(text, i)
        if not m or (i > 0 and (text[i - 1].isalnum() or text[i - 1] == "_")):
            i += 1
            continue
        open_paren = m.end() - 1
        result = convert_call(text, m.start(), open_paren, qualifier)
        if result:
            text, _ = result
            converted += 1
            continue  # the same call again: a second argument could hold another marker
        args, close = split_arguments(text, open_paren)
        messages = args[1:] if m.group(1) == "TINYDDP_CHECK" else args
        if any(MARKER in text[s:e] for s, e in messages):
            left.append(m.start())
        i = close
    return text, converted, left


def in_tinyddp(text):
    return re.search(r"^\s*namespace tinyddp\b|^\s*using namespace tinyddp;", text, re.M) is not None


def tracked_sources(root):
    out = subprocess.run(["git", "ls-files", "--", "*.h", "*.cpp", "*.cu", "*.cuh"], cwd=root, check=True,
                         capture_output=True, text=True).stdout.split()
    return [f for f in out if not f.startswith("scripts/")]


def line_of(text, offset):
    return text.count("\n", 0, offset) + 1


def main(argv):
    check = "--check" in argv
    list_left = "--list-left" in argv
    rest = [a for a in argv if not a.startswith("--")]
    root = os.path.abspath(rest[0] if rest else os.path.join(os.path.dirname(__file__), ".."))
    files_changed = calls = 0
    left_total, elsewhere = 0, []
    for rel in tracked_sources(root):
        path = os.path.join(root, rel)
        with open(path, encoding="utf-8") as f:
            text = f.read()
        if MARKER not in text:
            continue
        qualifier = "" if in_tinyddp(text) else "tinyddp::"
        new, n, left = convert_text(text, qualifier)
        left_total += len(left)
        if list_left:
            for offset in left:
                print(f"{rel}:{line_of(new, offset)}: a hint this script does not take apart (convert it by hand)")
            for number, line in enumerate(new.splitlines(), 1):
                if MARKER in line and not re.search(r"\b(TINYDDP_CHECK|TINYDDP_FAIL)\b", line):
                    elsewhere.append(f"{rel}:{number}: {line.strip()[:100]}")
        if n:
            files_changed += 1
            calls += n
            if not check:
                with open(path, "w", encoding="utf-8") as f:
                    f.write(new)
    for line in elsewhere:
        print(line)
    verb = "would change" if check else "changed"
    print(f"convert_hints: {verb} {calls} calls in {files_changed} files; {left_total} TINYDDP_CHECK/FAIL calls "
          f"with a hint left as text (--list-left names them)")
    return 1 if check and calls else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
