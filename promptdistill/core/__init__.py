"""What every stage shares: errors, configuration, JSON and files, statistics, process defaults."""
