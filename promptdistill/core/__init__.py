"""What every stage shares: errors, configuration, JSON and files, statistics, figures as text, process defaults."""
