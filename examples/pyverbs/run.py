#!/usr/bin/python3
"""run.py - run rdma-core's own Python tests (vendored from rdma-core v44.0, ./rdma-core/tests)
against one RDMA device and report every test's outcome.

    uiw run -- /usr/bin/python3 examples/pyverbs/run.py --dev uiw_lo [NAME...]

NAME is a test file (test_qpex), a class (test_qpex.QpExTestCase) or a test
(test_qpex.QpExTestCase.test_qp_ex_rc_rdma_write); a name given twice runs twice. Default: every
vendored test file. Needs Debian's python3-pyverbs (hence /usr/bin/python3, the interpreter it
is installed for).

Output, one line a test, then one line a file, then the closing line:
    ok test_qpex.QpExTestCase.test_qp_ex_rc_rdma_write
    skip test_qpex.QpExTestCase.test_qp_ex_xrc_send: Create XRCD is not supported
    FAIL test_...: <the assertion>          (ERROR likewise, with the exception)
    file test_qpex: 9 passed, 0 failed, 0 errors, 11 skipped
    N passed, N failed, N skipped           (failed counts errors too)
Exit status 0 when no test failed or errored and at least one passed; 1 otherwise; 2 when the
tests cannot be loaded. A test that rdma-core skips (the device lacks what it needs: UD, XRC,
memory windows, device memory, ...) is reported as skipped with rdma-core's reason.
"""

import argparse
import gc
import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
VENDORED = os.path.join(HERE, "rdma-core")
FILES = sorted(f[:-3] for f in os.listdir(os.path.join(VENDORED, "tests"))
               if f.startswith("test_") and f.endswith(".py"))


def short(test_id):
    """tests.test_qpex.QpExTestCase.test_x -> test_qpex.QpExTestCase.test_x"""
    return test_id[len("tests."):] if test_id.startswith("tests.") else test_id


def one_line(text):
    lines = [l.strip() for l in str(text).strip().splitlines() if l.strip()]
    return lines[-1] if lines else ""


class Result(unittest.TextTestResult):
    """Prints each outcome as one line and counts them per test file."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.per_file = {}
        self.counts = {"ok": 0, "FAIL": 0, "ERROR": 0, "skip": 0}

    def _note(self, test, kind, why=""):
        name = short(test.id())
        f = name.split(".", 1)[0]
        self.per_file.setdefault(f, {"ok": 0, "FAIL": 0, "ERROR": 0, "skip": 0})[kind] += 1
        self.counts[kind] += 1
        print(f"{kind} {name}" + (f": {why}" if why else ""), flush=True)

    def addSuccess(self, test):
        super().addSuccess(test)
        self._note(test, "ok")

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self._note(test, "skip", reason)

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._note(test, "FAIL", one_line(self.failures[-1][1]))

    def addError(self, test, err):
        super().addError(test, err)
        self._note(test, "ERROR", one_line(self.errors[-1][1]))

    def addExpectedFailure(self, test, err):
        super().addExpectedFailure(test, err)
        self._note(test, "ok")

    def addUnexpectedSuccess(self, test):
        super().addUnexpectedSuccess(test)
        self._note(test, "FAIL", "unexpected success")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dev", required=True, help="the RDMA device (uiw_lo)")
    ap.add_argument("--list", action="store_true", help="list the vendored test files and exit")
    ap.add_argument("names", nargs="*", help="test files, classes or tests (default: all files)")
    args = ap.parse_args()
    if args.list:
        print("\n".join(FILES))
        return 0

    # rdma-core's tests import `args_parser` and the package `tests` from their directory, and
    # read the device from args_parser (what run_tests.py's --dev sets).
    sys.path.insert(0, os.path.join(VENDORED, "tests"))
    sys.path.insert(0, VENDORED)
    try:
        from args_parser import parser
        sys.argv[1:] = ["--dev", args.dev]
        parser.parse_args()
        names = ["tests." + n for n in (args.names or FILES)]
        suite = unittest.defaultTestLoader.loadTestsFromNames(names)
    except Exception as ex:  # a missing pyverbs, a file not vendored, a typo in a name
        print(f"run.py: cannot load the tests: {ex!r}", file=sys.stderr)
        return 2

    runner = unittest.TextTestRunner(stream=open(os.devnull, "w"), resultclass=Result,
                                     verbosity=0)
    result = runner.run(suite)
    # The tests' verbs objects go while the interpreter is whole (pyverbs' close at interpreter
    # shutdown trips over a half-torn-down weakref module and prints noise).
    del suite, runner
    gc.collect()
    for kind, items in (("FAIL", result.failures), ("ERROR", result.errors)):
        for test, tb in items:
            print(f"\n--- {kind} {short(test.id())} ---\n{tb}", file=sys.stderr)
    for f in sorted(result.per_file):
        c = result.per_file[f]
        print(f"file {f}: {c['ok']} passed, {c['FAIL']} failed, {c['ERROR']} errors, "
              f"{c['skip']} skipped")
    c = result.counts
    bad = c["FAIL"] + c["ERROR"]
    print(f"{c['ok']} passed, {bad} failed, {c['skip']} skipped", flush=True)
    return 0 if bad == 0 and c["ok"] > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
