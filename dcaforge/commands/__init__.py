"""The command line's commands: each parses its options, calls the library (which never prints)
and prints what it returns; :mod:`dcaforge.cli` puts them together."""
