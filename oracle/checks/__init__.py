"""The checks, one module each (oracle/checks/NAME.py): its verdict function over both modes' frozen results, the
runs it makes of its own if any (a `CheckRun`, run by oracle.execute through a `CheckContext`), and its row
(`ROW`, a `Check`). `oracle.judge.CHECKS` lists the rows in the order they run and are reported; the types
they share are in oracle.checks.base, the comparison against the solo run that invariance and drift share
in oracle.checks.solo.
"""
