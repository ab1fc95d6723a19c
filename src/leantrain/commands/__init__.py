"""Commands: the drivers behind each subcommand (train, plan, bench, predict, eval, inspect) that cli.py calls."""
