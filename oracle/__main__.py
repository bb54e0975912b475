from oracle.cli import entry

entry()
