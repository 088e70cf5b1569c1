"""One module per `gates` command, each a thin page over the packages that do the work: its options,
the calls, what it prints (gates.cli._printers, gates.cli._progress). gates.cli._app registers them,
in the order `gates --help` lists them (COMMANDS there)."""
