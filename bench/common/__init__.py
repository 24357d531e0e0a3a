"""How the bench measures: summaries and ratios, the machine's record, the read bandwidth."""
