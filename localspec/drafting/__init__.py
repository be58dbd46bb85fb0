"""Draft sources and what they cost: the drafter protocol, the copier, the draft model, predictions, costs."""
