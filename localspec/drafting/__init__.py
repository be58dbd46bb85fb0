"""Draft sources and what they cost: the drafter protocol, the copier, predictions, forced tokens, the draft model
and its policy, the batch probe, the cost model and its store."""
