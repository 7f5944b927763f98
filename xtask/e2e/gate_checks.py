"""What the e2e's scripts share: one line per check (`ok - WHAT` or `FAIL - WHAT: WHY`,
counted), the action id in a staged answer, and running a script's `main` so that any stop
is a failed check with its story. The scripts import it from their own folder, which comes
first on `sys.path`; its name must not be the name of a module the SDKs import.
"""

import asyncio
import re
import sys
import traceback

try:
    BaseExceptionGroup
except NameError:  # Python 3.10: anyio brings the backport
    from exceptiongroup import BaseExceptionGroup


class Checks:
    """The checks of one script, each printed as it is made; `prefix` starts every line's
    subject (for example "simulate: ")."""

    def __init__(self, prefix=""):
        self.prefix = prefix
        self.failed = 0

    def check(self, what, ok, why=""):
        """Print one check's line; remember a failure. Returns `ok`."""
        if ok:
            print(f"ok - {self.prefix}{what}", flush=True)
        else:
            self.failed += 1
            print(f"FAIL - {self.prefix}{what}: {why}", flush=True)
        return ok

    def run(self, main, options, what):
        """Run `main(options)` and exit: non-zero when it stopped early (a failed check
        `what`, with the exceptions that stopped it) or any check failed."""
        try:
            asyncio.run(main(options))
        except BaseException as error:  # noqa: BLE001 - any stop is a failed check, with its story
            why = "; ".join(f"{type(leaf).__name__}: {leaf}" for leaf in leaves(error))
            self.check(what, False, why)
            traceback.print_exc(file=sys.stderr)
            sys.exit(1)
        sys.exit(1 if self.failed else 0)


def leaves(error):
    """The exceptions inside task-group wrappers, which say what actually went wrong."""
    if isinstance(error, BaseExceptionGroup):
        return [leaf for inner in error.exceptions for leaf in leaves(inner)]
    return [error]


def staged_id(answer):
    """The action id in an answer that says it staged the call ("Staged as action 7: ...")."""
    found = re.search(r"Staged as action (\d+)", answer)
    return int(found.group(1)) if found else None
