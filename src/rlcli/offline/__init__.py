"""Learning from data: datasets of transitions (made, written, read and checked) for offline runs."""
