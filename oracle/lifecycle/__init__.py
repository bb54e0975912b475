"""How a run starts, is watched and ends, so that every way it ends leaves a true report.

`supervise` (the parent that owns the exit code), `run_guard` (the report folder checked and a
"started" report written first), `signals` (SIGINT/SIGTERM as one exception), `watchdog` (every
engine call under a deadline), `exit_trap` (`os._exit` in an engine), `tether` (servers and workers
that die with the process that started them).
"""
