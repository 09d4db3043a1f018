"""One module per `pool-advisor` subcommand; each exposes `register(subparsers)`."""
