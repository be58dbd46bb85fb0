"""What several test files share: helpers, stand-ins, references."""
