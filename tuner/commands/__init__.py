"""One module per ``tuner`` subcommand; each has ``register(subparsers)``."""
