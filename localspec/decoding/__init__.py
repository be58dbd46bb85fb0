"""The speculative loop and its policy: the engine, the planner, conversations, and loading a pair."""
