"""The speculative loop and its policy: the engine, the planner that picks each round's draft, and loading a pair."""
