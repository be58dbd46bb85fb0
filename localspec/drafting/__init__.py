"""Draft sources and what they cost: the drafter protocol, the copier, earlier answers, predictions, forced tokens,
the draft model and its policy, the cost model, its measurement and its store."""
