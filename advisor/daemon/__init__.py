"""daemon: the only room that sequences I/O and logic, one timed cycle after another."""
