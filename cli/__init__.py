"""The `luce` command line: one module per command, loaded only when that command runs."""
