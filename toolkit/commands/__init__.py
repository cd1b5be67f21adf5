"""One module per command family: each resolves what the command line gave, runs one flow or library call, and
prints the result (a table on the terminal, JSON with --json). Each returns the exit code; the CLI maps
errors to theirs. Nothing here decides anything a flow or a report does not already say.
"""
