"""How one call runs: bind its values, execute cortex._sql's statements, decode rows, map errors."""
