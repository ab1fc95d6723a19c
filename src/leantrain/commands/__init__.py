"""Commands: the drivers behind each ``leantrain`` subcommand (train, plan, bench, predict, eval, inspect), wiring
config, data, model and engine together; ``leantrain.cli`` only parses arguments and calls one of them."""
